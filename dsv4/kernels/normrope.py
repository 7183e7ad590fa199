"""RMSNorm then partial RoPE of a row in one kernel (reference: dsv4.model.rope.apply_rope of
dsv4.model.norm.rms_norm / unweighted_rms_norm): attention's kv (weighted by kv_norm) and its
queries (q_b's per-head norm, unweighted), one launch each instead of two.

One program per row of x [T, (heads,) dim]. The norm rounds as the reference does (weighted:
x * rstd rounded to x's dtype, then times the weight; unweighted: rstd rounded to x's dtype first),
so the rotation starts from the values the reference's rope reads; the trailing `2 * half` channels
rotate in fp32 pairs (2i, 2i+1) by the row's (cos, sin), the leading ones are stored as normed. x's
rows along T are read with their stride (X_STRIDE; heads and channels contiguous within one), so kv's column
slice of attention's stacked wq_a/wkv output is read in place; the output is contiguous.
"""

import torch

from . import device_function, launcher, next_pow2, pdl_wait, row_stride

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # through benchmarks/gpu_batch_checks.sh (its CUDA tests and test_replay_gpu, session 4): "auto" runs it on CUDA


@device_function
def _normed(x, rstd, w_ptr, offs, mask, HAS_WEIGHT: constexpr, dt: constexpr):
    """x (fp32) normed and rounded to dt as the reference rounds it, back in fp32."""
    if HAS_WEIGHT:
        y = (x * rstd).to(dt).to(tl.float32)
        return (tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32) * y).to(dt).to(tl.float32)
    return (x * rstd.to(dt).to(tl.float32)).to(dt).to(tl.float32)


def _attn_norm_rope_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, eps, H: constexpr, DIM: constexpr, HALF: constexpr,
                      X_STRIDE: constexpr, HAS_WEIGHT: constexpr, BLOCK: constexpr):
    pdl_wait()
    r = tl.program_id(0).to(tl.int64)
    t = r // H
    dt = out_ptr.dtype.element_ty
    NOPE = DIM - 2 * HALF
    i = tl.arange(0, BLOCK)
    row = x_ptr + t * X_STRIDE + (r - t * H) * DIM
    x = tl.load(row + i, mask=i < DIM, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / DIM + eps)
    nope = i < NOPE
    tl.store(out_ptr + r * DIM + i, _normed(x, rstd, w_ptr, i, nope, HAS_WEIGHT, dt).to(dt), mask=nope)
    j = tl.arange(0, HALF)
    even_at = NOPE + 2 * j
    every = even_at < DIM
    even = _normed(tl.load(row + even_at).to(tl.float32), rstd, w_ptr, even_at, every, HAS_WEIGHT, dt)
    odd = _normed(tl.load(row + even_at + 1).to(tl.float32), rstd, w_ptr, even_at + 1, every, HAS_WEIGHT, dt)
    c = tl.load(cos_ptr + t * HALF + j)
    s = tl.load(sin_ptr + t * HALF + j)
    tl.store(out_ptr + r * DIM + even_at, (even * c - odd * s).to(dt))
    tl.store(out_ptr + r * DIM + even_at + 1, (odd * c + even * s).to(dt))


def supported(x: torch.Tensor, weight, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """x [T, dim] (with a weight of [dim]) or [T, heads, dim] (no weight: q's per-head norm), cos/sin [T, half]."""
    half, lead = cos.shape[-1], cos.dim() - 1
    weight_ok = weight is None or (weight.shape == x.shape[-1:] and (
        weight.dtype in (x.dtype, torch.float32) or x.dtype == torch.float32))
    return (x.numel() > 0 and x.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and weight_ok and cos.dtype == torch.float32 and sin.dtype == torch.float32 and cos.is_contiguous()
            and sin.shape == cos.shape and half == next_pow2(half) and x.dim() in (cos.dim(), cos.dim() + 1)
            and tuple(x.shape[:lead]) == tuple(cos.shape[:-1]) and x.shape[-1] >= 2 * half
            and _t_stride(x, cos) is not None)


def _t_stride(x: torch.Tensor, cos: torch.Tensor) -> int | None:
    """X_STRIDE, the elements from the x of one of cos's rows to the next: a contiguous x's heads * dim, or (cos
    [T, half]) the row stride of an x whose rows are contiguous each (a column slice of a wider output)."""
    if x.is_contiguous():
        return x.numel() // cos[..., 0].numel()
    return row_stride(x) if cos.dim() == 2 else None


def norm_rope(x: torch.Tensor, weight, eps: float, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half, dim = cos.shape[-1], x.shape[-1]
    heads = x.shape[-2] if x.dim() == cos.dim() + 1 else 1
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    w = weight.contiguous() if weight is not None else x  # an unused pointer when there is no weight
    launcher(_attn_norm_rope_kernel, x)[(x.numel() // dim,)](
        x, w, cos, sin.contiguous(), out, float(eps), H=heads, DIM=dim, HALF=half, X_STRIDE=_t_stride(x, cos),
        HAS_WEIGHT=weight is not None, BLOCK=next_pow2(dim))
    return out
