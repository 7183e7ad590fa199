"""Partial, interleaved RoPE on the trailing `qk_rope_head_dim` channels of a head.

Two tables: "main" (rope_theta, plain) for sliding-only layers and "compress"
(compress_rope_theta with YaRN) for CSA/HCA layers, their compressors and the
indexer. Consecutive channel pairs (2i, 2i+1) rotate together.
"""

from __future__ import annotations

import torch

from .. import kernels
from ..config import ModelConfig, yarn_inv_freq
from ..kernels import rope as fused
from ..kernels import rope_table


class Rope:
    KINDS = ("main", "compress")

    def __init__(self, cfg: ModelConfig, device):
        rd = cfg.qk_rope_head_dim
        self.inv_freq = {
            "main": yarn_inv_freq(rd, cfg.rope_theta, None).to(device),
            "compress": yarn_inv_freq(rd, cfg.compress_rope_theta, cfg.rope_scaling).to(device),
        }
        self._stacked = torch.stack([self.inv_freq[k] for k in self.KINDS]).contiguous()  # the table kernel's

    def cos_sin(self, positions: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape [*positions.shape, rd/2] in fp32."""
        if self.one_launch(positions):
            cos, sin = rope_table.tables(positions.reshape(-1), self.inv_freq[kind].view(1, -1))
            return cos.view(*positions.shape, -1), sin.view(*positions.shape, -1)
        freqs = positions.float().unsqueeze(-1) * self.inv_freq[kind]
        return freqs.cos(), freqs.sin()

    def cos_sin_kinds(self, positions: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """cos_sin of positions [N] for every kind in one launch (where one_launch holds): the same bits as one
        kind at a time, each element being its own position's."""
        cos, sin = rope_table.tables(positions, self._stacked)
        return {k: (cos[i], sin[i]) for i, k in enumerate(self.KINDS)}

    def one_launch(self, positions: torch.Tensor) -> bool:
        """Whether the table kernel computes these positions' tables (else torch: a launch per op and kind)."""
        return kernels.enabled(rope_table, positions) and rope_table.supported(positions.reshape(-1),
                                                                                self._stacked)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Rotate the trailing 2*cos.shape[-1] channels of x [..., T, (heads,) dim] (by -sin if inverse).

    cos/sin are [T, rd/2]; when x has a heads axis after T they broadcast over it.
    """
    if kernels.enabled(fused, x) and fused.supported(x, cos):
        return fused.apply_rope(x, cos, sin, inverse)
    if inverse:
        sin = -sin
    rd = cos.shape[-1] * 2
    if x.dim() == cos.dim() + 1:  # [T, H, dim]
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    nope, rope = x[..., :-rd], x[..., -rd:].float()
    even, odd = rope[..., 0::2], rope[..., 1::2]
    rotated = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)
    return torch.cat([nope, rotated.to(x.dtype)], dim=-1)
