"""FP8 / FP4 quantisation in the official DeepSeek-V4 layouts.

FP8: e4m3 values, one power-of-two (ue8m0) scale per 128x128 block.
FP4: e2m1 values packed two per byte (low nibble = even column), one ue8m0 scale
per row and 32 inputs. Both invert `dsv4.model.weights.QWeight.dequant` exactly
for values already on the grid.
"""

from __future__ import annotations

import math

import torch

from ..model.weights import FP4_BLOCK, FP4_VALUES, FP8_BLOCK

FP8_MAX = 448.0
FP4_MAX = 6.0
# e8m0 holds 2**-127 .. 2**127 (255 is NaN).
_E8M0_MIN, _E8M0_MAX = -127, 127


def pow2_exponent(amax: torch.Tensor, top: float) -> torch.Tensor:
    """Smallest e with amax <= top * 2**e (e = 0 where amax == 0), as int32, clamped to e8m0's range.

    log2 alone can land one off at exact powers of two after rounding; the two corrections
    against exact power-of-two products (no rounding) make the result exact.
    """
    amax = amax.float()
    e = torch.ceil(torch.log2(amax / top)).nan_to_num(0, posinf=0, neginf=0)
    e = torch.where(amax > top * torch.exp2(e), e + 1, e)
    e = torch.where(amax <= top * torch.exp2(e - 1), e - 1, e)
    e = torch.where(amax > 0, e, torch.zeros_like(e))
    return e.clamp(_E8M0_MIN, _E8M0_MAX).to(torch.int32)


def e8m0_from_exponent(e: torch.Tensor) -> torch.Tensor:
    """Exponent e (int) -> float8_e8m0fnu holding exactly 2**e (bit pattern e + 127)."""
    return (e.to(torch.int32) + 127).to(torch.uint8).view(torch.float8_e8m0fnu)


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] float -> (float8_e4m3fn [out, in], float8_e8m0fnu [ceil(out/128), ceil(in/128)])."""
    if w.dim() != 2:
        raise ValueError(f"quantize_fp8 needs a 2-D weight, got shape {tuple(w.shape)}")
    rows, cols = w.shape
    nr, nc = math.ceil(rows / FP8_BLOCK), math.ceil(cols / FP8_BLOCK)
    w = w.float()
    # Zero padding to whole blocks leaves each block's amax unchanged.
    padded = torch.nn.functional.pad(w, (0, nc * FP8_BLOCK - cols, 0, nr * FP8_BLOCK - rows))
    amax = padded.abs().reshape(nr, FP8_BLOCK, nc, FP8_BLOCK).amax(dim=(1, 3))
    e = pow2_exponent(amax, FP8_MAX)
    full = torch.exp2(e.float()).repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)
    data = (w / full[:rows, :cols]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return data, e8m0_from_exponent(e)


_FP4_GRID = torch.tensor(FP4_VALUES[:8], dtype=torch.float32)  # magnitudes of codes 0..7


def quantize_fp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] float -> (int8 [out, in/2] packed e2m1, float8_e8m0fnu [out, in/32]).

    Rounds to the nearest e2m1 value, ties to the even code (as hardware casts do).
    """
    if w.dim() != 2:
        raise ValueError(f"quantize_fp4 needs a 2-D weight, got shape {tuple(w.shape)}")
    rows, cols = w.shape
    if cols % FP4_BLOCK:
        raise ValueError(f"quantize_fp4 needs in_features divisible by {FP4_BLOCK}, got shape {tuple(w.shape)}")
    w = w.float()
    groups = w.reshape(rows, cols // FP4_BLOCK, FP4_BLOCK)
    e = pow2_exponent(groups.abs().amax(dim=-1), FP4_MAX)
    x = (groups / torch.exp2(e.float()).unsqueeze(-1)).reshape(rows, cols)
    mag = x.abs().clamp(max=FP4_MAX)
    grid = _FP4_GRID.to(w.device)
    lo = (torch.bucketize(mag, grid, right=True) - 1).clamp(0, 7)
    hi = (lo + 1).clamp(max=7)
    d_lo, d_hi = mag - grid[lo], grid[hi] - mag
    code = torch.where((d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0)), hi, lo)
    nib = (code | torch.where((x < 0) & (code > 0), 8, 0)).to(torch.uint8)
    packed = nib[:, 0::2] | (nib[:, 1::2] << 4)
    return packed.view(torch.int8), e8m0_from_exponent(e)
