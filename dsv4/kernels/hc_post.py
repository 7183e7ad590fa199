"""mHC's post in one kernel (reference: dsv4.model.hc.hc_post): the sublayer's output placed by
`post` plus the streams mixed by `comb`, rounded once."""

import torch

from . import cdiv, launcher, next_pow2, pdl_wait

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # through benchmarks/gpu_checks.sh: "auto" runs it on CUDA (dsv4.kernels.enabled)


def supported(h: torch.Tensor, hc: int) -> bool:
    return h.is_contiguous() and hc == next_pow2(hc) and h.shape[-2] == hc


def _hc_post_kernel(out_ptr, post_ptr, comb_ptr, h_ptr, new_ptr, D: constexpr, HC: constexpr,
                    BLOCK_D: constexpr):
    pdl_wait()
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    k = tl.arange(0, HC)
    ok = d < D
    dt = new_ptr.dtype.element_ty
    # post and comb are rounded to the streams' dtype first, as the reference multiplies in it.
    post = tl.load(post_ptr + t * HC + k).to(dt).to(tl.float32)
    comb = tl.load(comb_ptr + t * HC * HC + k[:, None] * HC + k[None, :]).to(dt).to(tl.float32)  # [j, k]
    x = tl.load(out_ptr + t * D + d, mask=ok, other=0.0).to(tl.float32)
    h = tl.load(h_ptr + t * HC * D + k[:, None] * D + d[None, :], mask=ok[None, :], other=0.0).to(tl.float32)
    mixed = tl.sum(comb[:, :, None] * h[:, None, :], axis=0)  # [k, d] = sum_j comb[j, k] h[j, d]
    new = post[:, None] * x[None, :] + mixed
    tl.store(new_ptr + t * HC * D + k[:, None] * D + d[None, :], new.to(dt), mask=ok[None, :])


def hc_post(out, post, comb, h):
    """out [T, D], post [T, hc], comb [T, hc, hc], h [T, hc, D] -> new streams [T, hc, D]."""
    T, hc, D = h.shape
    new = torch.empty_like(h)
    block = min(256, next_pow2(D))
    launcher(_hc_post_kernel, h)[(T, cdiv(D, block))](out.contiguous(), post.contiguous(), comb.contiguous(), h, new,
                                                       D=D, HC=hc, BLOCK_D=block)
    return new
