"""Partial interleaved RoPE in one kernel (reference: dsv4.model.rope.apply_rope).

One program per row of x [..., (heads,) dim]: the leading `dim - 2 * half`
channels are copied, the trailing pairs (2i, 2i+1) rotated in fp32 by the
row's (cos, sin); `inverse` rotates by -sin (attention's output de-rotation).
"""

import torch

from . import launcher, next_pow2, pdl_wait

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # through benchmarks/gpu_checks.sh: "auto" runs it on CUDA (dsv4.kernels.enabled)


def _rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, sign, H: constexpr, DIM: constexpr, NOPE: constexpr, HALF: constexpr,
                 BLOCK: constexpr):
    pdl_wait()
    r = tl.program_id(0).to(tl.int64)
    t = r // H
    i = tl.arange(0, BLOCK)
    for d0 in range(0, NOPE, BLOCK):
        m = (d0 + i) < NOPE
        tl.store(out_ptr + r * DIM + d0 + i, tl.load(x_ptr + r * DIM + d0 + i, mask=m), mask=m)
    j = tl.arange(0, HALF)
    base = r * DIM + NOPE + 2 * j
    even = tl.load(x_ptr + base).to(tl.float32)
    odd = tl.load(x_ptr + base + 1).to(tl.float32)
    c = tl.load(cos_ptr + t * HALF + j)
    s = tl.load(sin_ptr + t * HALF + j) * sign
    dt = out_ptr.dtype.element_ty
    tl.store(out_ptr + base, (even * c - odd * s).to(dt))
    tl.store(out_ptr + base + 1, (odd * c + even * s).to(dt))


def supported(x: torch.Tensor, cos: torch.Tensor) -> bool:
    half, lead = cos.shape[-1], cos.dim() - 1
    return (x.is_contiguous() and cos.is_contiguous() and cos.dtype == torch.float32 and x.numel() > 0
            and half == next_pow2(half) and x.dim() in (cos.dim(), cos.dim() + 1)
            and tuple(x.shape[:lead]) == tuple(cos.shape[:-1]) and x.shape[-1] >= 2 * half)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    half, dim = cos.shape[-1], x.shape[-1]
    heads = x.shape[-2] if x.dim() == cos.dim() + 1 else 1
    out = torch.empty_like(x)
    launcher(_rope_kernel, x)[(x.numel() // dim,)](x, cos, sin.contiguous(), out,
                                                   -1.0 if inverse else 1.0, H=heads, DIM=dim, NOPE=dim - 2 * half, HALF=half,
                                                   BLOCK=min(1024, next_pow2(max(dim - 2 * half, 1))))
    return out
