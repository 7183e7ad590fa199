"""RMSNorm over the last axis in one kernel (reference: dsv4.model.norm).

Rounding follows the reference: the weighted norm rounds x * rstd to x's dtype,
then multiplies by the weight; the unweighted one (q_b's per-head norm) rounds
rstd to x's dtype first and multiplies in x's dtype.

x is read with its row stride (X_STRIDE): a column slice [rows, N] of a wider output is normed in place (attention's
q part of its stacked wq_a/wkv projection); the output is contiguous.
"""

import torch

from . import device_function, launcher, next_pow2, pdl_wait, row_stride

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # through benchmarks/gpu_checks.sh: "auto" runs it on CUDA (dsv4.kernels.enabled)


def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, eps, N: constexpr, X_STRIDE: constexpr, HAS_WEIGHT: constexpr,
                     BLOCK: constexpr):
    pdl_wait()
    r = tl.program_id(0).to(tl.int64)
    _rms_row(x_ptr + r * X_STRIDE, w_ptr, out_ptr + r * N, eps, N, HAS_WEIGHT, BLOCK)


@device_function
def _rms_row(row, w_ptr, out_row, eps, N: constexpr, HAS_WEIGHT: constexpr, BLOCK: constexpr):
    """One row's norm (normrope's paired kernel runs it too: the same code, the same bits)."""
    i = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for n0 in range(0, N, BLOCK):
        x = tl.load(row + n0 + i, mask=(n0 + i) < N, other=0.0).to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
    dt = out_row.dtype.element_ty
    for n0 in range(0, N, BLOCK):
        m = (n0 + i) < N
        x = tl.load(row + n0 + i, mask=m, other=0.0)
        if HAS_WEIGHT:
            y = (x.to(tl.float32) * rstd).to(dt)
            y = (tl.load(w_ptr + n0 + i, mask=m, other=0.0).to(tl.float32) * y.to(tl.float32)).to(dt)
        else:
            y = (x.to(tl.float32) * rstd.to(dt).to(tl.float32)).to(dt)
        tl.store(out_row + n0 + i, y, mask=m)


def supported(x: torch.Tensor, weight) -> bool:
    # The reference's weighted output dtype is x's; a weight of a wider dtype than x would widen it.
    return _x_stride(x) is not None and x.numel() > 0 and (weight is None or weight.dtype in (x.dtype, torch.float32)
                                                    or x.dtype == torch.float32)


def _x_stride(x: torch.Tensor) -> int | None:
    """The kernel's row stride: N for a contiguous x of any rank, or a 2-D x's rows (contiguous each)."""
    if x.is_contiguous():
        return x.shape[-1]
    return row_stride(x) if x.dim() == 2 else None


def rms_norm(x: torch.Tensor, weight, eps: float) -> torch.Tensor:
    N = x.shape[-1]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    w = weight.contiguous() if weight is not None else x  # an unused pointer when there is no weight
    launcher(_rms_norm_kernel, x)[(x.numel() // N,)](x, w, out, float(eps), N=N, X_STRIDE=_x_stride(x),
                                                     HAS_WEIGHT=weight is not None, BLOCK=min(2048, next_pow2(N)))
    return out
