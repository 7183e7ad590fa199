"""A step's rope tables in one launch (reference: dsv4.model.rope.Rope.cos_sin, one kind at a time).

cos and sin of positions x inv_freq for several kinds of table at once (a decode step's "main" and "compress"; the
compressed windows' first positions, which dsv4.kernels.geometry writes in fp32), fp32: the position converted to
fp32 and multiplied by the frequency as the reference does, then the CUDA math
library's precise cosf / sinf (libdevice), the functions torch's CUDA cos and sin call. The reference takes a
multiply, a cos and a sin launch (and a conversion) per kind; a decode step made 14 such launches.
"""

import os

import torch

from . import interpreting, launcher, next_pow2, pdl_wait

try:
    import triton.language as tl
    from triton.language import constexpr
    from triton.language.extra import libdevice
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr, libdevice = None, int, None

# Through the GPU checks in session 17 call 4 (under DSV4_ROPE_TABLE=1: its CUDA test, torch's bits; graph == eager,
# pooled == solo; the gate): "auto" runs it on CUDA; DSV4_ROPE_TABLE=0 keeps torch's ops.
GPU_CHECKED = os.environ.get("DSV4_ROPE_TABLE", "1") == "1"
BLOCK_ROWS = 16


def _table_kernel(pos_ptr, inv_ptr, cos_ptr, sin_ptr, N, HALF: constexpr, BLOCK: constexpr, LIBDEVICE: constexpr):
    """Grid (row blocks, kinds): rows of kind k's tables [N, HALF] at (cos|sin)_ptr + k * N * HALF. LIBDEVICE: the
    CUDA math library's cosf / sinf (tl.cos and tl.sin are the approximate instructions on a GPU); off under
    Triton's interpreter, whose tl.cos and tl.sin are numpy's and which has no libdevice."""
    pdl_wait()
    kind = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = rows < N
    p = tl.load(pos_ptr + rows, mask=ok, other=0).to(tl.float32)
    j = tl.arange(0, HALF)
    freqs = p[:, None] * tl.load(inv_ptr + kind * HALF + j)[None, :]
    at = (kind * N + rows.to(tl.int64))[:, None] * HALF + j[None, :]
    if LIBDEVICE:
        c, s = libdevice.cos(freqs), libdevice.sin(freqs)
    else:
        c, s = tl.cos(freqs), tl.sin(freqs)
    tl.store(cos_ptr + at, c, mask=ok[:, None])
    tl.store(sin_ptr + at, s, mask=ok[:, None])


def supported(positions: torch.Tensor, inv_freq: torch.Tensor) -> bool:
    half = inv_freq.shape[-1]
    return (positions.dim() == 1 and positions.dtype in (torch.int64, torch.int32, torch.float32)
            and positions.is_contiguous()
            and inv_freq.dtype == torch.float32 and half == next_pow2(half) and positions.numel() > 0)


def tables(positions: torch.Tensor, inv_freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [kinds, N, half] of positions [N] times inv_freqs [kinds, half] (contiguous fp32)."""
    kinds, half = inv_freqs.shape
    n = positions.shape[0]
    cos = torch.empty(kinds, n, half, dtype=torch.float32, device=positions.device)
    sin = torch.empty_like(cos)
    launcher(_table_kernel, positions)[(-(-n // BLOCK_ROWS), kinds)](positions, inv_freqs, cos, sin, n, HALF=half,
                                                                      BLOCK=BLOCK_ROWS, LIBDEVICE=not interpreting())
    return cos, sin
