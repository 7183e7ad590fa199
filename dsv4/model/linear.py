"""Linears over stored weights (`QWeight`): y = x W^T.

Decode (a few rows) on a GPU runs the fused GEMV on the stored FP8/FP4 bytes
(dsv4.kernels.qgemv); otherwise the weight is dequantised to x's dtype and one
GEMM runs (the reference, and prefill's path). Dense weights always take the GEMM.

In a decode step every row must come out as it would alone (dsv4.model.rows): the GEMV computes
each row on its own; the GEMM fallback runs row by row there (`dense`).
"""

from __future__ import annotations

import torch

from .. import kernels
from ..kernels import dequant, qgemv
from ..formats import QWeight
from .rows import dense, per_row, rows_per_weight, step_gemv


def _fused(x: torch.Tensor, w: QWeight, rows: int) -> bool:
    return w.fmt != "dense" and kernels.enabled(qgemv, x) and qgemv.supported(x, w, rows)


def linear(x: torch.Tensor, w: QWeight, out: torch.Tensor | None = None, release: bool = False) -> torch.Tensor:
    """out: a contiguous [rows, N] buffer in x's dtype that the GEMV kernels write into where they run; the
    result is what is returned (the torch path's own tensor elsewhere). release: qgemv.linear's (the caller's word
    about the next kernel's reads before its wait)."""
    if _fused(x, w, rows_per_weight(x)):
        return qgemv.linear(x, w, out, kernel=step_gemv(), release=release)
    return dense(x, dequantised(w, x), out, source=w.data)


def dequantised(w: QWeight, x: torch.Tensor) -> torch.Tensor:
    """w.dequant(x.dtype): an FP8 weight in one launch of dsv4.kernels.dequant where it runs (the same bits)."""
    if kernels.enabled(dequant, x) and dequant.fp8_supported(w, x.dtype) and w.data.device == x.device:
        return dequant.fp8_dequant(w, x.dtype)
    return w.dequant(x.dtype)


def grouped_linear(x: torch.Tensor, w: QWeight, groups: int) -> torch.Tensor:
    """Block-diagonal linear (attention's wo_a): x [T, groups * Kg], w [groups * O, Kg] -> [T, groups * O]."""
    T, O = x.shape[0], w.shape[0] // groups
    kernel = step_gemv()
    if _fused(x, w, rows_per_weight(x)) and O % qgemv.block_n(kernel) == 0:
        return qgemv.grouped_linear(x, w, groups, kernel=kernel)
    return _grouped(x, dequantised(w, x).view(groups, O, -1))


@per_row()
def _grouped(x: torch.Tensor, wo: torch.Tensor) -> torch.Tensor:
    return torch.einsum("tgi,goi->tgo", x.reshape(x.shape[0], wo.shape[0], -1), wo).flatten(1)


def experts_fused(x: torch.Tensor, stacks: list[QWeight]) -> bool:
    """Whether expert_linear can run every stack (the rows differ in weights, so no row limit)."""
    return all(_fused(x, w, 0) for w in stacks)


def expert_linear(x: torch.Tensor, stack: QWeight, experts: torch.Tensor, rows_per_x: int) -> torch.Tensor:
    """Output row r: expert experts[r] of `stack` applied to x[r // rows_per_x]."""
    return qgemv.expert_linear(x, stack, experts, rows_per_x)
