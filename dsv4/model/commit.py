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
from ..kernels import undo as fused_undo


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


class Undo:
    """The writes of a verify step (dsv4.speculative), applied as its rows go rather than staged to the end: row j
    of a verify step is the decode step at pos + j, so it must see rows 0..j-1's cache rows as that step would
    (committed), and does once they are applied. Each application keeps the bytes it overwrote, so the step takes
    back what it does not commit (the rows after the last accepted one; every row when the verdict refuses), in
    reverse order: the state's bytes are then those of the steps it commits, and nothing else."""

    def __init__(self):
        self.records: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]] = []

    @staticmethod
    def _fused(t: torch.Tensor, elements: int) -> bool:
        # Inside a CUDA graph capture with CONFIG capture (see kernels/undo.py) and a table's room reserved before it
        # (replay.VerifyReplay's); else torch's ops, whose records the fused take-back reads alike
        capturing = t.is_cuda and torch.cuda.is_current_stream_capturing()
        return (fused_undo.CONFIG["fused"] and kernels.use_triton(t) and (fused_undo.CONFIG["capture"] or not capturing)
                and fused_undo.ready(elements, t.device))

    def apply(self, writes: list[Write], row: "int | list"):
        """Apply row `row`'s writes now (where their keep holds), keeping what they overwrite (in one launch with
        dsv4.kernels.undo, CONFIG fused). row: a verify row, or one per write, each a row or a device tensor [n] of
        the row behind each of the write's n indices (the rows of a verify step applied as one chunk)."""
        rows = row if isinstance(row, list) else [row] * len(writes)
        if writes and self._fused(writes[0].buf, len(writes) * fused_undo.APPLY_FIELDS) and fused_undo.supported(writes):
            saves = [torch.empty((w.rows.shape[0], *w.buf.shape[1:]), dtype=w.buf.dtype, device=w.buf.device)
                     for w in writes]
            fused_undo.apply(writes, saves)
            self.records += [(w.buf, w.index, s, r) for w, s, r in zip(writes, saves, rows)]
            return
        for w, r in zip(writes, rows):
            old = w.buf[w.index]  # a copy (advanced indexing)
            new = w.rows.to(w.buf.dtype)
            if w.keep is not None:
                keep = w.keep.view(-1, *([1] * (new.dim() - 1))) if w.keep.dim() else w.keep
                new = torch.where(keep, new, old)
            w.buf.index_copy_(0, w.index, new)
            self.records.append((w.buf, w.index, old, r))

    def take_back(self, kept: torch.Tensor):
        """kept [rows] bool (device): write back what each row not kept overwrote, the last write first (all in one
        launch with dsv4.kernels.undo, CONFIG fused: the same bytes, see there)."""
        if self.records and self._fused(kept, len(self.records) * fused_undo.BACK_FIELDS) and \
                all(buf.is_contiguous() for buf, _, _, _ in self.records):
            fused_undo.take_back(self.records, kept)
            self.records = []
            return
        for buf, index, old, row in reversed(self.records):
            if isinstance(row, torch.Tensor):  # a row for each index
                keep = kept.index_select(0, row).view(-1, *([1] * (old.dim() - 1)))
            else:
                keep = kept[row]
            buf.index_copy_(0, index, torch.where(keep, buf[index], old))
        self.records = []


def _in_one_launch(writes: list[Write]) -> bool:
    return (bool(writes) and kernels.enabled(commit_step, writes[0].buf) and commit_step.supported(writes)
            and commit_step.ready(writes))
