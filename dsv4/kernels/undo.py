"""A verify step's writes and their taking back in few launches (reference: dsv4.model.commit.Undo's torch ops).

A verify step (dsv4.speculative) applies each row's writes as the row goes and keeps what they overwrite; at the
end it writes back what the rows it does not keep overwrote. In torch that is a gather and an index_copy a write
(and a where where the write has a keep mask), then a gather, a where and an index_copy a write again: some 30-40
small launches a row and compressed layer on a Flash rank. Here:

* `apply(writes, saves)`: one launch for all of a row's writes (one program per write and split, as
  kernels/commit_step's table): each row of the write first copies the bits it is about to overwrite into its save
  buffer (`saves[w]`, [n, ...] in the buffer's dtype), then writes the new row where keep holds (the same value as
  torch's `.to`: bits where the dtypes agree, else through fp32 rounding to nearest even).
* `take_back(records, kept)`: one launch for every record of the step: where `kept[row]` does not hold, the saved
  bits go back. The records run at once: within a verify step of at most as many rows as its smallest ring, no two
  rows write one ring slot, and the rows that write one store row (a window's, with keep set only where it closes)
  all saved the same old bits, so the order does not matter (the reference's reverse order gives the same bytes).
  A record of a verify step's rows as one chunk (model.attention._in_chunk) holds several rows' indices, each tagged
  with its row (a device tensor, read per index); one chunk writes each index once.

Tables are int64 rows built on the host from the tensors' addresses: eager, copied from pinned memory without a
sync; in a CUDA graph capture, slices of a device buffer reserved before the capture (`reserve`, sized by `counting`
an eager warm-up of the same step), filled by `captured()` once the capture has ended and before the first replay
(replay.VerifyReplay does all three).

Off by default (CONFIG fused, DSV4_UNDO_FUSED=1; inside a capture also CONFIG capture, DSV4_UNDO_FUSED_CAPTURE=1):
tests/test_undo.py checks it against the torch ops in Triton's interpreter and on CUDA, tests/test_speculative_gpu.py
its verify graphs against the plain decode steps.
"""

from __future__ import annotations

import contextlib

import torch

from . import device_function, getenv, launcher, next_pow2, pdl_wait, row_stride

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

# Session 48 (H200): eager it holds (tests/test_undo.py's CUDA cases); replays of a verify graph captured with it
# faulted (an illegal address): its tables were memory of the graph's own pool (see _Tables), found in session 49 with
# compute-sanitizer. Session 49 call D (H200), the tables in room reserved before the capture: test_undo's CUDA cases and
# test_speculative_gpu's verify graphs (drafts right and wrong, 2 and 4 rows: the plain steps' tokens and bytes) pass;
# on mini a verify graph of 4 rows 3.06 ms and 282 kernel nodes against torch's ops' 4.47 ms and 825 (speculative_bench,
# benchmarks/RESULTS.md). Off by default until the gate's speculative check and the MTP layer's verify graphs run with
# it (benchmarks/gpu_s50_call1.sh; session 49's device time ran out): DSV4_UNDO_FUSED=1 (eager), with
# DSV4_UNDO_FUSED_CAPTURE=1 inside verify graphs too.
GPU_CHECKED = True
CONFIG = {"fused": getenv("DSV4_UNDO_FUSED", "0") == "1", "capture": getenv("DSV4_UNDO_FUSED_CAPTURE", "0") == "1"}

FLOATS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
APPLY_FIELDS = 9  # buf, index, rows, keep, save (addresses), rows, width, codes, rows' stride
BACK_FIELDS = 8  # buf, index, save (addresses), rows, width, code, verify row, verify rows (address, or 0)
BLOCK = 512
MAX_SPLIT = 16


@device_function
def _copy_bits(dst, d, src, s, m, WIDE: constexpr):
    """dst[d] = src[s] bit for bit (32-bit words where WIDE, else 16-bit)."""
    if WIDE:
        tl.store(dst.to(tl.pointer_type(tl.int32), bitcast=True) + d,
                 tl.load(src.to(tl.pointer_type(tl.int32), bitcast=True) + s, mask=m), mask=m)
    else:
        tl.store(dst.to(tl.pointer_type(tl.int16), bitcast=True) + d,
                 tl.load(src.to(tl.pointer_type(tl.int16), bitcast=True) + s, mask=m), mask=m)


def _apply_kernel(table_ptr, SPLIT: constexpr, BLOCK: constexpr):
    pdl_wait()
    e = table_ptr + tl.program_id(0).to(tl.int64) * 9
    dst, index, src, keep, save = tl.load(e), tl.load(e + 1), tl.load(e + 2), tl.load(e + 3), tl.load(e + 4)
    n, width, codes, stride = tl.load(e + 5), tl.load(e + 6), tl.load(e + 7), tl.load(e + 8)
    src_code, dst_code = codes & 15, (codes >> 4) & 15
    c = tl.arange(0, BLOCK)
    i = tl.program_id(1).to(tl.int64)
    while i < n:  # while, not range: the interpreter cannot take a loaded bound as a range's
        ok = n > 0
        if keep != 0:
            ok = ok & (tl.load(keep.to(tl.pointer_type(tl.int8), bitcast=True) + i) != 0)
        row = tl.load(index.to(tl.pointer_type(tl.int64), bitcast=True) + i)
        c0 = width * 0
        while c0 < width:
            m = (c0 + c) < width
            d = row * width + c0 + c
            if dst_code == 0:  # what this row overwrites, first
                _copy_bits(save, i * width + c0 + c, dst, d, m, True)
            else:
                _copy_bits(save, i * width + c0 + c, dst, d, m, False)
            if ok:
                s = i * stride + c0 + c
                if src_code == dst_code:
                    if src_code == 0:
                        _copy_bits(dst, d, src, s, m, True)
                    else:
                        _copy_bits(dst, d, src, s, m, False)
                else:
                    if src_code == 0:
                        v = tl.load(src.to(tl.pointer_type(tl.float32), bitcast=True) + s, mask=m, other=0.0)
                    elif src_code == 1:
                        v = tl.load(src.to(tl.pointer_type(tl.bfloat16), bitcast=True) + s, mask=m,
                                    other=0.0).to(tl.float32)
                    else:
                        v = tl.load(src.to(tl.pointer_type(tl.float16), bitcast=True) + s, mask=m,
                                    other=0.0).to(tl.float32)
                    if dst_code == 0:
                        tl.store(dst.to(tl.pointer_type(tl.float32), bitcast=True) + d, v, mask=m)
                    elif dst_code == 1:
                        tl.store(dst.to(tl.pointer_type(tl.bfloat16), bitcast=True) + d, v.to(tl.bfloat16), mask=m)
                    else:
                        tl.store(dst.to(tl.pointer_type(tl.float16), bitcast=True) + d, v.to(tl.float16), mask=m)
            c0 += BLOCK
        i += SPLIT


def _back_kernel(table_ptr, kept_ptr, SPLIT: constexpr, BLOCK: constexpr):
    pdl_wait()
    e = table_ptr + tl.program_id(0).to(tl.int64) * 8
    dst, index, save, n = tl.load(e), tl.load(e + 1), tl.load(e + 2), tl.load(e + 3)
    width, code, verify_row, verify_rows = tl.load(e + 4), tl.load(e + 5), tl.load(e + 6), tl.load(e + 7)
    back = tl.load(kept_ptr + verify_row) == 0
    c = tl.arange(0, BLOCK)
    i = tl.program_id(1).to(tl.int64)
    while i < n:
        if verify_rows != 0:  # each index its own verify row
            back = tl.load(kept_ptr + tl.load(verify_rows.to(tl.pointer_type(tl.int64), bitcast=True) + i)) == 0
        if back:
            row = tl.load(index.to(tl.pointer_type(tl.int64), bitcast=True) + i)
            c0 = width * 0
            while c0 < width:
                m = (c0 + c) < width
                if code == 0:
                    _copy_bits(dst, row * width + c0 + c, save, i * width + c0 + c, m, True)
                else:
                    _copy_bits(dst, row * width + c0 + c, save, i * width + c0 + c, m, False)
                c0 += BLOCK
        i += SPLIT


def _write_supported(w) -> bool:
    n = w.rows.shape[0] if w.rows.dim() else -1
    return (w.buf.dtype in FLOATS and w.rows.dtype in FLOATS and w.index.dtype == torch.int64 and n > 0
            and w.buf.is_contiguous() and row_stride(w.rows) is not None and w.index.is_contiguous()
            and w.rows.shape[1:] == w.buf.shape[1:] and w.index.shape == (n,)
            and (w.keep is None or (w.keep.dtype == torch.bool and w.keep.is_contiguous() and w.keep.shape == (n,)))
            and all(t.device == w.buf.device for t in (w.rows, w.index) + (() if w.keep is None else (w.keep,))))


def supported(writes) -> bool:
    """Every write is one the table can hold, and no two of one row share a buffer (their programs run at once)."""
    return bool(writes) and all(_write_supported(w) for w in writes) and \
        len({w.buf.data_ptr() for w in writes}) == len(writes)


class _Tables:
    """Eager: a table from pinned host memory (torch's pinned allocator keeps it until its copy is done). In a
    capture: a slice of `room`, a device buffer made before the capture (`reserve`), recorded to be filled by `fill`
    once the capture has ended. Never memory of the graph's own pool: a block the capture hands out may have held a
    tensor freed earlier in it, whose writer then runs before the kernel in every replay and overwrites a table
    filled outside the graph (session 49 call C: compute-sanitizer, an invalid index pointer read from a table)."""

    def __init__(self):
        self.pending: list[tuple[int, list]] = []  # (offset in room, entries) of the capture's tables
        self.room: torch.Tensor | None = None
        self.used = 0
        self.counted: list[int] | None = None  # the elements eager tables took, while `counting`

    def ready(self, elements: int, device: torch.device) -> bool:
        """Whether a table of `elements` can be made now (in a capture: whether the room reserved holds it)."""
        if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
            return True
        return self.room is not None and self.room.device == device and self.used + elements <= self.room.numel()

    def get(self, entries: list, width: int, device: torch.device) -> torch.Tensor:
        n = len(entries) * width
        if self.counted is not None and not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            self.counted[0] += n
        if device.type != "cuda":
            return torch.tensor(entries, dtype=torch.int64, device=device)
        if torch.cuda.is_current_stream_capturing():
            if not self.ready(n, device):
                raise RuntimeError(f"kernels/undo: a table of {n} elements in a CUDA graph capture, with "
                                   f"{0 if self.room is None else self.room.numel() - self.used} reserved left "
                                   "(reserve() before the capture; commit.Undo checks ready())")
            table = self.room[self.used:self.used + n].view(len(entries), width)
            self.pending.append((self.used, entries))
            self.used += n
            return table
        return torch.tensor(entries, dtype=torch.int64).pin_memory().to(device, non_blocking=True)

    def fill(self) -> list[torch.Tensor]:
        # Taken off first, so a failed fill leaves nothing of a dead capture to the next one. The room is made
        # outside any inference mode, its fill too.
        pending, self.pending = self.pending, []
        room, self.room, self.used = self.room, None, 0
        for offset, entries in pending:  # slices made here: the capture's views of room were its inference mode's
            flat = torch.tensor(entries, dtype=torch.int64).flatten()
            room[offset:offset + flat.numel()].copy_(flat, non_blocking=False)
        return [] if room is None else [room]

    def discard(self):
        self.pending, self.room, self.used = [], None, 0


_tables = _Tables()


@contextlib.contextmanager
def counting():
    """Within: the elements of the tables that eager steps make, counted -> [count] (a capture of the same step then
    needs that much reserved: replay.VerifyReplay counts its last warm-up)."""
    count = [0]
    _tables.counted = count
    try:
        yield count
    finally:
        _tables.counted = None


def reserve(device: torch.device, elements: int) -> None:
    """Before a CUDA graph capture: room for its tables, outside the graph's memory pool (see _Tables)."""
    _tables.room = torch.zeros(elements, dtype=torch.int64, device=device) if elements else None
    _tables.used = 0


def ready(elements: int, device: torch.device) -> bool:
    """Whether a table of `elements` int64 can be made now: always eagerly; in a capture, within the room reserved."""
    return _tables.ready(elements, device)


def captured() -> list[torch.Tensor]:
    """After a CUDA graph capture: the tables it recorded, filled before its first replay -> the room that holds them,
    for the caller to keep as long as its graph (the graph reads them at every replay; replay.VerifyReplay keeps it)."""
    return _tables.fill()


def capture_failed() -> None:
    """After a CUDA graph capture that failed: its tables and room dropped (the next capture reserves its own)."""
    _tables.discard()


def apply(writes, saves: list[torch.Tensor]) -> None:
    """Each write's rows into its buffer where its keep holds, the overwritten rows' bits first into saves[w]."""
    entries = [(w.buf.data_ptr(), w.index.data_ptr(), w.rows.data_ptr(), 0 if w.keep is None else w.keep.data_ptr(),
                s.data_ptr(), w.rows.shape[0], w.rows[0].numel(), FLOATS[w.rows.dtype] | FLOATS[w.buf.dtype] << 4,
                row_stride(w.rows)) for w, s in zip(writes, saves)]
    split = min(MAX_SPLIT, next_pow2(max(w.rows.shape[0] for w in writes)))
    table = _tables.get(entries, APPLY_FIELDS, writes[0].buf.device)
    launcher(_apply_kernel, writes[0].buf)[(len(writes), split)](table, SPLIT=split, BLOCK=BLOCK)


def take_back(records, kept: torch.Tensor) -> None:
    """records: (buf, index, save, verify row); where kept[row] does not hold, save's bits back into buf[index]. A
    record's row may be a device tensor [n] (int64, contiguous) of the row behind each of its n indices."""
    entries = [(buf.data_ptr(), index.data_ptr(), save.data_ptr(), index.shape[0], save[0].numel(),
                0 if buf.element_size() == 4 else 1, 0 if isinstance(row, torch.Tensor) else row,
                row.data_ptr() if isinstance(row, torch.Tensor) else 0) for buf, index, save, row in records]
    split = min(MAX_SPLIT, next_pow2(max(index.shape[0] for _, index, _, _ in records)))
    table = _tables.get(entries, BACK_FIELDS, records[0][0].device)
    launcher(_back_kernel, records[0][0])[(len(records), split)](table, kept.view(torch.uint8), SPLIT=split,
                                                                  BLOCK=BLOCK)
