"""The commit of a step's staged writes: the transaction's only writes to the DecodeState's caches.

The forward stages every write (`Write`); `commit` applies them where the step's verdict is 0 (no
collective refused), on device, with masked copies. This loop is the reference of the fused
kernels: dsv4.kernels.commit_step (every write of the step in one launch) and dsv4.kernels.commit
(one launch per write).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import kernels
from ..kernels import commit as fused
from ..kernels import commit_step


@dataclass
class Write:
    """A staged write: `buf[index] = rows` where `keep` (and the step's verdict) hold."""

    buf: torch.Tensor
    index: torch.Tensor
    rows: torch.Tensor
    keep: torch.Tensor | None = None


def commit(writes: list[Write], verdict: torch.Tensor) -> None:
    """Apply every staged write where the verdict is 0 and its keep holds (rows that do not hold
    write their old values back)."""
    if _in_one_launch(writes):
        commit_step.commit(writes, verdict)
        return
    ok = verdict == 0
    for w in writes:
        if kernels.enabled(fused, w.buf) and fused.supported(w.buf, w.index, w.rows):
            fused.commit(w.buf, w.index, w.rows, w.keep, verdict)
            continue
        keep = ok if w.keep is None else ok & w.keep
        keep = keep.view(-1, *([1] * (w.rows.dim() - 1))) if keep.dim() else keep
        w.buf.index_copy_(0, w.index, torch.where(keep, w.rows.to(w.buf.dtype), w.buf[w.index]))


def _in_one_launch(writes: list[Write]) -> bool:
    return (bool(writes) and kernels.enabled(commit_step, writes[0].buf) and commit_step.supported(writes)
            and commit_step.ready(writes))
