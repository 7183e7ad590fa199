"""RMSNorm then partial RoPE of a row in one kernel (reference: dsv4.model.rope.apply_rope of
dsv4.model.norm.rms_norm / unweighted_rms_norm): attention's kv (weighted by kv_norm) and its
queries (q_b's per-head norm, unweighted), one launch each instead of two.

One program per row of x [T, (heads,) dim]. The norm rounds as the reference does (weighted:
x * rstd rounded to x's dtype, then times the weight; unweighted: rstd rounded to x's dtype first),
so the rotation starts from the values the reference's rope reads; the trailing `2 * half` channels
rotate in fp32 pairs (2i, 2i+1) by the row's (cos, sin), the leading ones are stored as normed. x's
rows along T are read with their stride (X_STRIDE; heads and channels contiguous within one), so kv's column
slice of attention's stacked wq_a/wkv output is read in place; the output is contiguous.

q_kv_norms (dsv4.layout CONFIG pair_norms, on): q's latent norm (kernels/norm.py's row) and kv's norm and rope read
the same projection's output, so one launch does both, each program the code of its own kernel (the same bits).
"""

import torch

from . import device_function, launcher, next_pow2, pdl_wait, row_stride
from . import norm
from .norm import _rms_row

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
    _norm_rope_row(x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, eps, r, r // H, H, DIM, HALF, X_STRIDE, HAS_WEIGHT, BLOCK)


@device_function
def _norm_rope_row(x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, eps, r, t, H: constexpr, DIM: constexpr, HALF: constexpr,
                   X_STRIDE: constexpr, HAS_WEIGHT: constexpr, BLOCK: constexpr):
    """Output row r (query t's head r - t * H) normed and roped (the paired kernel below runs it too: the same code;
    its sm_90 SASS is the kernel's of before it moved here)."""
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


def _q_kv_norms_kernel(q_ptr, q_w_ptr, q_out_ptr, kv_ptr, kv_w_ptr, cos_ptr, sin_ptr, kv_out_ptr, eps, T,
                       N: constexpr, Q_STRIDE: constexpr, Q_BLOCK: constexpr, DIM: constexpr, HALF: constexpr,
                       KV_STRIDE: constexpr, BLOCK: constexpr):
    """Grid (2 T,): programs 0..T-1 norm q's latent rows (norm.py's _rms_row, weighted), T..2T-1 norm and rope kv's
    rows (_norm_rope_row, weighted): each row the code its own kernel runs."""
    pdl_wait()
    r = tl.program_id(0).to(tl.int64)
    if r < T:
        _rms_row(q_ptr + r * Q_STRIDE, q_w_ptr, q_out_ptr + r * N, eps, N, True, Q_BLOCK)
    else:
        t = r - T
        _norm_rope_row(kv_ptr, kv_w_ptr, cos_ptr, sin_ptr, kv_out_ptr, eps, t, t, 1, DIM, HALF, KV_STRIDE, True, BLOCK)


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


def q_kv_supported(q_a: torch.Tensor, q_w, kv_a: torch.Tensor, kv_w, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """q_a [T, N] with its norm weight, kv_a [T, dim] with its, cos/sin [T, half]: both norms as their own kernels
    would take them (norm.supported, supported)."""
    return (q_a.dim() == 2 and kv_a.dim() == 2 and cos.dim() == 2 and q_a.shape[0] == kv_a.shape[0]
            and q_a.dtype == kv_a.dtype and norm.supported(q_a, q_w) and q_w is not None
            and supported(kv_a, kv_w, cos, sin) and kv_w is not None)


def q_kv_norms(q_a: torch.Tensor, q_w: torch.Tensor, kv_a: torch.Tensor, kv_w: torch.Tensor, eps: float,
               cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(q_a, q_w), norm_rope(kv_a, kv_w)) in one launch: both read the same projection's output (attention's
    stacked wq_a/wkv), so kv's norm and rope need not wait for wq_b. The bits of the two launches."""
    T, N = q_a.shape
    half, dim = cos.shape[-1], kv_a.shape[-1]
    q_out = torch.empty(q_a.shape, dtype=q_a.dtype, device=q_a.device)
    kv_out = torch.empty(kv_a.shape, dtype=kv_a.dtype, device=kv_a.device)
    launcher(_q_kv_norms_kernel, q_a)[(2 * T,)](
        q_a, q_w.contiguous(), q_out, kv_a, kv_w.contiguous(), cos, sin.contiguous(), kv_out, float(eps), T, N=N,
        Q_STRIDE=norm._x_stride(q_a), Q_BLOCK=min(2048, next_pow2(N)), DIM=dim, HALF=half,
        KV_STRIDE=_t_stride(kv_a, cos), BLOCK=next_pow2(dim))
    return q_out, kv_out
