"""The all-reduce door's bookkeeping in one kernel (reference: dsv4.parallel.Comm.all_reduce).

Before a reduction the door counts it in the census and builds the payload: the
partial sum x followed by one element, this door's refusal flag. The reference
takes two launches (census add, cat); here one kernel writes the payload straight
into its destination (for the one-shot all-reduce, the symmetric-memory buffer,
which saves the reference's third launch, the copy into it). It also adds the
previous door's reduced flag into the step's verdict (the reference's add after
each reduction: 86 launches a Flash step), so a step's verdict is complete once
Comm.end_step adds the last door's. The flags are small integers: the sum is
exact in any order.

CONFIG["in_place"] (on by default since its GPU run in session 8; DSV4_DOOR_IN_PLACE=0 turns it off) drops this kernel from a
step whose mHC boundaries run fused: the boundary before a door opens it (dsv4.parallel.Comm.open_door), its
kernel doing this kernel's bookkeeping (dsv4.kernels.hc_boundary: flag, census, verdict), and the sublayer's
last kernel writes its partial sum straight into the opened payload (Comm.payload).
"""

import os

import torch

from . import cdiv, launcher, pdl_wait

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # through benchmarks/gpu_checks.sh (session 3): "auto" runs it on CUDA
CONFIG = {"in_place": os.environ.get("DSV4_DOOR_IN_PLACE", "1") == "1"}


def _pack_kernel(x_ptr, out_ptr, flag_ptr, census_ptr, seen_ptr, verdict_ptr, N, SEEN: constexpr,
                 BLOCK: constexpr):
    pdl_wait()
    pid = tl.program_id(0)
    i = pid * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + i, mask=i < N, other=0.0)
    tl.store(out_ptr + i, v.to(out_ptr.dtype.element_ty), mask=i < N)
    if pid == 0:
        tl.store(out_ptr + N, tl.load(flag_ptr).to(out_ptr.dtype.element_ty))
        tl.store(census_ptr, tl.load(census_ptr) + 1)
        if SEEN:
            tl.store(verdict_ptr, tl.load(verdict_ptr) + tl.load(seen_ptr).to(tl.float32))


def supported(x: torch.Tensor) -> bool:
    return x.is_contiguous() and x.numel() > 0


def pack(x: torch.Tensor, out: torch.Tensor, flag: torch.Tensor, census: torch.Tensor,
         seen: torch.Tensor | None = None, verdict: torch.Tensor | None = None) -> torch.Tensor:
    """out[:n] = x (in out's dtype), out[n] = flag, census += 1, and verdict (fp32) += seen (the previous
    door's reduced flag, when given); returns out[:n + 1]."""
    n = x.numel()
    block = 1024
    launcher(_pack_kernel, x)[(cdiv(n, block),)](x, out, flag, census, flag if seen is None else seen,
                                                 flag if verdict is None else verdict, n, SEEN=seen is not None,
                                                 BLOCK=block)
    return out[:n + 1]
