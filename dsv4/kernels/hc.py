"""mHC's pre-map in one kernel (reference: dsv4.model.hc.hc_pre; the post is kernels/hc_post.py).

The stream norm, the pre/post/comb maps with Sinkhorn-Knopp, and the collapse
of the streams. Only the projection of the flattened streams stays a cuBLAS GEMV. The norm is
applied after it (linear(x * r) = r * linear(x) for a per-row scalar r), so the
kernel reads the streams twice (sum of squares, then the collapse) and the
24-value map once.
"""

import torch

from . import device_function, launcher, next_pow2, pdl_wait

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # through benchmarks/gpu_checks.sh: "auto" runs it on CUDA (dsv4.kernels.enabled)


def _hc_pre_kernel(h_ptr, mix_ptr, base_ptr, scale_ptr, post_ptr, comb_ptr, out_ptr, norm_eps, eps, D: constexpr,
                   HC: constexpr, ITERS: constexpr, BLOCK_D: constexpr):
    pdl_wait()
    t = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, HC)
    rows = h_ptr + t * HC * D + k[:, None] * D
    rstd = _streams_rstd(rows, norm_eps, D, HC, BLOCK_D)

    W = (2 + HC) * HC
    mix = mix_ptr + t * W
    s0 = tl.load(scale_ptr).to(tl.float32)
    s1 = tl.load(scale_ptr + 1).to(tl.float32)
    s2 = tl.load(scale_ptr + 2).to(tl.float32)
    pre = tl.sigmoid(tl.load(mix + k) * rstd * s0 + tl.load(base_ptr + k).to(tl.float32)) + eps
    post = 2 * tl.sigmoid(tl.load(mix + HC + k) * rstd * s1 + tl.load(base_ptr + HC + k).to(tl.float32))
    j = k[:, None] * HC + k[None, :]
    c = tl.load(mix + 2 * HC + j) * rstd * s2 + tl.load(base_ptr + 2 * HC + j).to(tl.float32)
    c = tl.exp(c - tl.max(c, axis=1)[:, None])
    c = c / tl.sum(c, axis=1)[:, None] + eps
    c = c / (tl.sum(c, axis=0)[None, :] + eps)
    for _ in tl.static_range(ITERS - 1):
        c = c / (tl.sum(c, axis=1)[:, None] + eps)
        c = c / (tl.sum(c, axis=0)[None, :] + eps)
    tl.store(post_ptr + t * HC + k, post)
    tl.store(comb_ptr + t * HC * HC + j, c)

    _collapse(rows, pre, out_ptr + t * D, D, BLOCK_D)


@device_function
def _streams_rstd(rows, norm_eps, D: constexpr, HC: constexpr, BLOCK_D: constexpr):
    """1 / rms of a token's HC streams [HC, D] at rows (one norm over all HC * D values), in fp32."""
    d = tl.arange(0, BLOCK_D)
    acc = tl.zeros([HC, BLOCK_D], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        m = (d0 + d) < D
        x = tl.load(rows + d0 + d[None, :], mask=m[None, :], other=0.0).to(tl.float32)
        acc += x * x
    return tl.rsqrt(tl.sum(tl.sum(acc, axis=1), axis=0) / (HC * D) + norm_eps)


@device_function
def _collapse(rows, pre, out, D: constexpr, BLOCK_D: constexpr):
    """out [D] = sum over the streams k of pre[k] * rows[k], in out's dtype."""
    d = tl.arange(0, BLOCK_D)
    for d0 in range(0, D, BLOCK_D):
        m = (d0 + d) < D
        x = tl.load(rows + d0 + d[None, :], mask=m[None, :], other=0.0).to(tl.float32)
        y = tl.sum(pre[:, None] * x, axis=0)
        tl.store(out + d0 + d, y.to(out.dtype.element_ty), mask=m)


def supported(h: torch.Tensor, hc: int) -> bool:
    return h.is_contiguous() and hc == next_pow2(hc) and h.shape[-2] == hc


def hc_pre(h, mix, base, scale, hc: int, iters: int, norm_eps: float, eps: float):
    """h [T, hc, D] and its un-normed mix [T, (2 + hc) * hc] fp32 (the caller's product with hc_fn: it
    chooses how rows are multiplied) -> (post [T, hc] fp32, comb [T, hc, hc] fp32, collapsed [T, D] h.dtype)."""
    T, _, D = h.shape
    mix = mix.contiguous()
    post = torch.empty(T, hc, dtype=torch.float32, device=h.device)
    comb = torch.empty(T, hc, hc, dtype=torch.float32, device=h.device)
    out = torch.empty(T, D, dtype=h.dtype, device=h.device)
    launcher(_hc_pre_kernel, h)[(T,)](h, mix, base.contiguous(), scale.contiguous(), post, comb, out,
                                      float(norm_eps), float(eps), D=D, HC=hc, ITERS=iters,
                                      BLOCK_D=min(1024, next_pow2(D)))
    return post, comb, out
