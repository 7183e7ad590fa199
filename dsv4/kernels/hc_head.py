"""mHC's head collapse in one kernel (reference: dsv4.model.hc.hc_head).

The streams' norm, the pre weights and the collapse of the streams into the head's input, as kernels/hc.py does
for a layer's pre-map: the projection of the flattened streams stays a GEMV (dense's, on the un-normed rows), and
the norm is applied after it (linear(x * r) = r * linear(x) for a per-row scalar r): the reference's sums in
another order (within its tolerances), each row its own program (the same alone and batched). The reference
takes a norm, three elementwise ops, a multiply, a sum and a conversion: 7 launches a step.
"""

import os

import torch

from . import launcher, next_pow2, pdl_wait
from .hc import _collapse, _streams_rstd

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

# Session 18 calls 1-3 on an H200 (benchmarks/RESULTS.md): its CUDA tests, graph == eager and pooled == solo under it,
# the GPU suite; mini's solo graph 791 -> 809 tok/s under DSV4_PDL (~1 % slower without PDL: the kernel then waits
# on its GEMV like the torch ops it replaces). DSV4_HC_HEAD=0: the torch reference.
GPU_CHECKED = os.environ.get("DSV4_HC_HEAD", "1") == "1"
# wide_mix (DSV4_HC_HEAD_WIDE=0 turns it off; on by default since session 41, call 5): the mix's GEMV reads the
# streams in their own dtype and widens each input as it loads it (dense's kernel does: x.to(fp32) before its
# products), its output fp32, instead of a launch that converts the flattened streams to fp32 first (a copy of hc * D
# values a row, and a break in the PDL chain). The same products of the same values (test_hc_head); mini's pipelined
# decode +0.5 % against it off (call 5).
CONFIG = {"wide_mix": os.environ.get("DSV4_HC_HEAD_WIDE", "1") == "1"}


def _hc_head_kernel(h_ptr, mix_ptr, base_ptr, scale_ptr, out_ptr, norm_eps, eps, D: constexpr, HC: constexpr,
                    BLOCK_D: constexpr):
    pdl_wait()
    t = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, HC)
    rows = h_ptr + t * HC * D + k[:, None] * D
    rstd = _streams_rstd(rows, norm_eps, D, HC, BLOCK_D)
    pre = tl.sigmoid(tl.load(mix_ptr + t * HC + k) * rstd * tl.load(scale_ptr).to(tl.float32)
                     + tl.load(base_ptr + k).to(tl.float32)) + eps
    _collapse(rows, pre, out_ptr + t * D, D, BLOCK_D)


def supported(h: torch.Tensor, hc: int) -> bool:
    return h.is_contiguous() and h.dim() == 3 and hc == next_pow2(hc) and h.shape[-2] == hc and h.shape[0] > 0


def hc_head(h: torch.Tensor, mix: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, norm_eps: float,
            eps: float) -> torch.Tensor:
    """h [T, hc, D] and its un-normed projection mix [T, hc] fp32 (the caller's GEMV with hc_head_fn) ->
    the collapsed rows [T, D] in h's dtype."""
    T, hc, D = h.shape
    out = torch.empty(T, D, dtype=h.dtype, device=h.device)
    launcher(_hc_head_kernel, h)[(T,)](h, mix.contiguous(), base.contiguous(), scale.contiguous(), out,
                                       float(norm_eps), float(eps), D=D, HC=hc, BLOCK_D=min(1024, next_pow2(D)))
    return out
