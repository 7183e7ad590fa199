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

Tables are int64 rows built on the host from the tensors' addresses: eager, copied from pinned memory without a
sync; in a CUDA graph capture, an empty device table made in the capture (an allocation, no node), filled by
`captured()` once the capture has ended and before the first replay (replay.VerifyReplay calls it).

Off by default (CONFIG fused, DSV4_UNDO_FUSED=1; inside a capture also CONFIG capture, DSV4_UNDO_FUSED_CAPTURE=1):
tests/test_undo.py checks it against the torch ops in Triton's interpreter and eager on CUDA.
"""

from __future__ import annotations

import torch

from . import device_function, getenv, launcher, next_pow2, pdl_wait, row_stride

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

# Session 48 (H200): eager it holds (tests/test_undo.py's CUDA cases); replays of a verify graph captured with it
# faulted (an illegal address). Until then a capture's tables were dropped once filled, back to the graph's pool while
# the graph still read them; now the graph's owner keeps them (`captured` returns them). Inside a capture only with
# CONFIG capture (DSV4_UNDO_FUSED_CAPTURE=1) until a GPU run shows that was the fault.
GPU_CHECKED = False
CONFIG = {"fused": getenv("DSV4_UNDO_FUSED", "0") == "1", "capture": getenv("DSV4_UNDO_FUSED_CAPTURE", "0") == "1"}

FLOATS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
APPLY_FIELDS = 9  # buf, index, rows, keep, save (addresses), rows, width, codes, rows' stride
BACK_FIELDS = 7  # buf, index, save (addresses), rows, width, code, verify row
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
    e = table_ptr + tl.program_id(0).to(tl.int64) * 7
    dst, index, save, n = tl.load(e), tl.load(e + 1), tl.load(e + 2), tl.load(e + 3)
    width, code, verify_row = tl.load(e + 4), tl.load(e + 5), tl.load(e + 6)
    back = tl.load(kept_ptr + verify_row) == 0
    c = tl.arange(0, BLOCK)
    i = tl.program_id(1).to(tl.int64)
    while back and i < n:
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
    capture: an empty device table of the capture's own, recorded to be filled by `fill` after the capture."""

    def __init__(self):
        self.pending: list[tuple[torch.Tensor, list]] = []

    def get(self, entries: list, width: int, device: torch.device) -> torch.Tensor:
        if device.type != "cuda":
            return torch.tensor(entries, dtype=torch.int64, device=device)
        if torch.cuda.is_current_stream_capturing():
            table = torch.empty(len(entries), width, dtype=torch.int64, device=device)
            self.pending.append((table, entries))
            return table
        return torch.tensor(entries, dtype=torch.int64).pin_memory().to(device, non_blocking=True)

    def fill(self) -> list[torch.Tensor]:
        # the tables were made in the capture's inference mode: their fill is an in-place update of inference tensors,
        # refused outside it (the first GPU run, session 48). Taken off the list first, so a failed fill leaves no
        # table of a dead capture to the next one.
        pending, self.pending = self.pending, []
        with torch.inference_mode():
            for table, entries in pending:
                table.copy_(torch.tensor(entries, dtype=torch.int64), non_blocking=False)
        return [table for table, _ in pending]

    def discard(self):
        self.pending = []


_tables = _Tables()


def captured() -> list[torch.Tensor]:
    """After a CUDA graph capture: the tables it recorded, filled before its first replay -> them, for the caller to
    keep as long as its graph: the graph reads them at every replay, and a table let go goes back to the graph's
    memory pool, free to be handed out again (replay.VerifyReplay keeps them)."""
    return _tables.fill()


def capture_failed() -> None:
    """After a CUDA graph capture that failed: its tables dropped (the next capture records its own)."""
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
    """records: (buf, index, save, verify row); where kept[row] does not hold, save's bits back into buf[index]."""
    entries = [(buf.data_ptr(), index.data_ptr(), save.data_ptr(), index.shape[0], save[0].numel(),
                0 if buf.element_size() == 4 else 1, row) for buf, index, save, row in records]
    split = min(MAX_SPLIT, next_pow2(max(index.shape[0] for _, index, _, _ in records)))
    table = _tables.get(entries, BACK_FIELDS, records[0][0].device)
    launcher(_back_kernel, records[0][0])[(len(records), split)](table, kept.view(torch.uint8), SPLIT=split,
                                                                  BLOCK=BLOCK)
