"""The number formats of DeepSeek-V4's official weights: containers, codecs and quantisation.

FP8: e4m3 values, one power-of-two (ue8m0) scale per 128x128 block (dense linears).
FP4: e2m1 values packed two per byte (low nibble = even column), one ue8m0 scale per
row and 32 inputs (routed experts). `QWeight` holds a linear weight in any of them,
quantised in memory, and dequantises it where it is used; `quantize_fp8`/`quantize_fp4`
invert `QWeight.dequant` exactly for values already on the grid.

The bottom floor of the package: it imports nothing of dsv4.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

FP8_BLOCK = 128  # dense linears: 128x128 weight blocks, one ue8m0 scale each
FP4_BLOCK = 32  # routed experts: one ue8m0 scale per 32 inputs (along K)

# E2M1 value of each nibble (sign bit 3).
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


@dataclass
class QWeight:
    """A linear weight [out, in]: dense, FP8 e4m3 with 128x128 block scales, or FP4 e2m1 (two per byte).

    `row0`/`col0` are the offsets of this slice inside the full tensor, so a rank's slice that
    starts inside a scale block still finds its scale.
    """

    data: torch.Tensor
    scale: torch.Tensor | None = None
    fmt: str = "dense"  # "dense" | "fp8" | "fp4"
    row0: int = 0
    col0: int = 0

    @property
    def shape(self) -> tuple[int, int]:
        rows, cols = self.data.shape[-2:]
        return (rows, cols * 2) if self.fmt == "fp4" else (rows, cols)

    def dequant(self, dtype: torch.dtype) -> torch.Tensor:
        if self.fmt == "dense":
            return self.data if self.data.dtype == dtype else self.data.to(dtype)
        rows, cols = self.shape
        br, bc = (FP8_BLOCK, FP8_BLOCK) if self.fmt == "fp8" else (1, FP4_BLOCK)
        if not (self.row0 % br or self.col0 % bc or rows % br or cols % bc):
            return self._dequant_blocks(dtype, br, bc)
        return self._dequant_any(dtype)

    def _dequant_blocks(self, dtype, br: int, bc: int) -> torch.Tensor:
        """Whole scale blocks: one broadcast multiply. Exact in bf16 and fp32 alike (e4m3 and e2m1 values
        times a power of two), so it equals the general path bit for bit."""
        rows, cols = self.shape
        lead = self.data.shape[:-2]
        if self.fmt == "fp8":
            values = self.data.to(dtype)
        else:
            values = unpack_fp4(self.data, dtype)
        blocks = values.view(*lead, rows // br, br, cols // bc, bc)
        scale = self.scale.float().to(dtype)[..., :, None, :, None]
        return (blocks * scale).view(*lead, rows, cols)

    def _dequant_any(self, dtype: torch.dtype) -> torch.Tensor:
        rows, cols = self.shape
        if self.fmt == "fp8":
            values = self.data.float()
            br, bc = FP8_BLOCK, FP8_BLOCK
        else:
            values = unpack_fp4(self.data)
            br, bc = 1, FP4_BLOCK
        scale = self.scale.float()
        scale = scale.repeat_interleave(br, dim=-2)[..., self.row0 % br: self.row0 % br + rows, :]
        scale = scale.repeat_interleave(bc, dim=-1)[..., self.col0 % bc: self.col0 % bc + cols]
        return (values * scale).to(dtype)

    def to(self, device) -> "QWeight":
        return QWeight(self.data.to(device), None if self.scale is None else self.scale.to(device),
                       self.fmt, self.row0, self.col0)

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + (0 if self.scale is None else self.scale.nbytes)


def stack_rows(parts: list[QWeight]) -> tuple[QWeight, list[QWeight]] | None:
    """One weight holding the rows of `parts` in order (linears of one input, then one launch), and each part
    again as a view of its storage, or None where they cannot share one: other formats, dtypes, widths or
    devices, a slice of a larger tensor (row0, col0), or an FP8 part before the last whose rows end inside a
    128-row scale block (its last block's scale would cover the next part's rows)."""
    first = parts[0]
    if any(p.fmt != first.fmt or p.data.dtype != first.data.dtype or p.data.dim() != 2 or p.row0 or p.col0
           or p.data.shape[1] != first.data.shape[1] or p.data.device != first.data.device for p in parts):
        return None
    if first.fmt == "fp8" and any(p.data.shape[0] % FP8_BLOCK for p in parts[:-1]):
        return None
    if first.fmt != "dense" and any(p.scale.dtype != first.scale.dtype or p.scale.shape[1:] != first.scale.shape[1:]
                                    for p in parts):
        return None
    data = torch.cat([p.data for p in parts])
    scale = None if first.fmt == "dense" else torch.cat([p.scale for p in parts])
    views, row = [], 0
    for p in parts:
        rows = p.data.shape[0]
        if scale is None:
            part_scale = None
        else:
            per = FP8_BLOCK if p.fmt == "fp8" else 1  # rows per scale row
            part_scale = scale[row // per: row // per + p.scale.shape[0]]
        views.append(QWeight(data[row: row + rows], part_scale, p.fmt))
        row += rows
    return QWeight(data, scale, first.fmt), views


_LUTS: dict[tuple, torch.Tensor] = {}


def unpack_fp4(packed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Two e2m1 values per byte, low nibble first -> `dtype`, twice as wide (one table lookup per byte)."""
    key = (packed.device, dtype)
    lut = _LUTS.get(key)
    if lut is None:  # made once per device: a host->device copy must not happen inside a graph capture
        pairs = [(FP4_VALUES[b & 0xF], FP4_VALUES[b >> 4]) for b in range(256)]
        lut = _LUTS[key] = torch.tensor(pairs, dtype=dtype, device=packed.device)
    u8 = packed.view(torch.uint8)
    both = lut.index_select(0, u8.flatten().long())  # [n, 2]
    return both.view(*packed.shape[:-1], packed.shape[-1] * 2)


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
