"""The commit of a whole step's staged writes in one launch (reference: dsv4.model.commit.commit's loop).

A decode step stages ~7 writes per compressed layer (ring rows, compressed entries, sliding-window
rows); one launch each is ~250 launches per Flash token. Here every write is a row of one table
[writes, FIELDS] int64 on the device: the addresses of its buffer, index, rows and keep (0: none), its
row count, its row width in elements, its dtype codes and the stride of its rows (each row contiguous; a column
view of a wider output, dsv4.layout fuse_xproj, is read in place). Program (w, g) copies rows g, g + G, ...
of write w: `buf[index[i]] = rows[i]` where keep[i] holds and the step's verdict is 0. Rows that do
not hold are not written at all (the reference writes their old values back: the same bytes, since
a step's kept rows have distinct indices). Same dtype: the bits are copied; otherwise the value goes
through fp32 and rounds to nearest even, as torch's `.to` does. Each write has its own buffer
(`supported` checks it), so the programs touch disjoint rows and the launch is deterministic.

The table is built on the host from the tensors' addresses and copied to the device without a sync
(`_Tables`). An eager step's intermediates may land at other addresses each step, so its table may
change (an unchanged one is reused, nothing copied). A CUDA graph capture takes a device buffer made before
it (zeros) and keeps it ever after; its table, fixed for the graph's life, is copied in once the capture has
ended (`captured`, which dsv4.replay calls after each capture), so the graph holds no memcpy node: the copy,
~2.4 us a token, and the break of the PDL chain it made (a memcpy never releases early) leave the step. A graph
replayed before `captured` commits nothing (its table's rows are empty), never a stray write.
"""

from __future__ import annotations

import torch

from . import launcher, next_pow2, pdl_wait, row_stride

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # through benchmarks/gpu_batch_checks.sh (test_replay_gpu with it in the graph, session 4): "auto" runs it on CUDA

FIELDS = 8  # buf, index, rows, keep (addresses), rows, width, codes, rows' stride (a 64-byte row)
FLOATS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
BLOCK = 512
MAX_SPLIT = 64  # programs per write when it has many rows (a prefill chunk)


def _commit_step_kernel(table_ptr, verdict_ptr, SPLIT: constexpr, BLOCK: constexpr):
    pdl_wait()
    e = table_ptr + tl.program_id(0).to(tl.int64) * 8
    dst, index, src, keep = tl.load(e), tl.load(e + 1), tl.load(e + 2), tl.load(e + 3)
    n, width, codes, stride = tl.load(e + 4), tl.load(e + 5), tl.load(e + 6), tl.load(e + 7)
    src_code, dst_code = codes & 15, (codes >> 4) & 15
    commits = tl.load(verdict_ptr) == 0
    c = tl.arange(0, BLOCK)
    i = tl.program_id(1).to(tl.int64)
    while i < n:  # while, not range: the interpreter cannot take a loaded bound as a range's
        ok = commits
        if keep != 0:
            ok = ok & (tl.load(keep.to(tl.pointer_type(tl.int8), bitcast=True) + i) != 0)
        row = tl.load(index.to(tl.pointer_type(tl.int64), bitcast=True) + i)
        c0 = width * 0
        while ok and c0 < width:
            m = (c0 + c) < width
            s = i * stride + c0 + c
            d = row * width + c0 + c
            if src_code == dst_code:  # a copy of the bits, whatever they hold
                if src_code == 0:
                    tl.store(dst.to(tl.pointer_type(tl.int32), bitcast=True) + d,
                             tl.load(src.to(tl.pointer_type(tl.int32), bitcast=True) + s, mask=m), mask=m)
                else:
                    tl.store(dst.to(tl.pointer_type(tl.int16), bitcast=True) + d,
                             tl.load(src.to(tl.pointer_type(tl.int16), bitcast=True) + s, mask=m), mask=m)
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


def _write_supported(w) -> bool:
    n = w.rows.shape[0] if w.rows.dim() else -1
    return (w.buf.dtype in FLOATS and w.rows.dtype in FLOATS and w.index.dtype == torch.int64 and n >= 0
            and w.buf.is_contiguous() and (n == 0 or row_stride(w.rows) is not None) and w.index.is_contiguous()
            and w.rows.shape[1:] == w.buf.shape[1:] and w.index.shape == (n,)
            and (w.keep is None or (w.keep.dtype == torch.bool and w.keep.is_contiguous() and w.keep.shape == (n,)))
            and all(t.device == w.buf.device for t in (w.rows, w.index) + (() if w.keep is None else (w.keep,))))


def supported(writes) -> bool:
    """Every write is one the table can hold, and no two share a buffer (their programs run at once)."""
    return all(_write_supported(w) for w in writes) and len({w.buf.data_ptr() for w in writes}) == len(writes)


def _entry(w) -> tuple:
    codes = FLOATS[w.rows.dtype] | FLOATS[w.buf.dtype] << 4
    return (w.buf.data_ptr(), w.index.data_ptr(), w.rows.data_ptr(), 0 if w.keep is None else w.keep.data_ptr(),
            w.rows.shape[0], w.rows[0].numel(), codes, row_stride(w.rows))


class _Tables:
    """Where each step's table comes from. Eager: a fresh pinned host copy whenever the addresses change
    (torch's pinned allocator keeps it until the copy is done), else the last device table, unchanged.
    Capture: `spare`, a device buffer of zeros made by an eager step before the capture (a fill during a capture
    would be a node of its graph), which the graph then reads at every replay: it is kept for the life of the
    process, a few KB per capture, and filled with the capture's table by `captured` after the capture ends."""

    def __init__(self):
        self.last = None  # (device, stream, entries, device table) of the last eager step
        self.spare: torch.Tensor | None = None
        self.captured: list[torch.Tensor] = []
        self.pending: list[tuple[torch.Tensor, tuple]] = []  # (device table, entries) of captures not yet filled

    def ready(self, n: int, device: torch.device) -> bool:
        """Whether a table of n writes can be made now (in a capture: whether the spare holds it)."""
        return not _capturing(device) or (self.spare is not None and self.spare.shape[0] >= n
                                          and self.spare.device == device)

    def get(self, entries: tuple, device: torch.device) -> torch.Tensor:
        if device.type != "cuda":
            return torch.tensor(entries, dtype=torch.int64, device=device)
        if _capturing(device):
            table = self.spare[:len(entries)]
            self.captured.append(self.spare)
            self.pending.append((table, entries))
            self.spare = None
            return table
        stream = torch.cuda.current_stream(device).cuda_stream
        if self.last is None or self.last[:3] != (device, stream, entries):
            host = torch.tensor(entries, dtype=torch.int64).pin_memory()
            self.last = (device, stream, entries, host.to(device, non_blocking=True))
        if self.spare is None or self.spare.shape[0] < len(entries) or self.spare.device != device:
            with torch.inference_mode(False):  # a normal tensor: a capture in or out of inference mode reads it
                self.spare = torch.zeros(len(entries), FIELDS, dtype=torch.int64, device=device)
        return self.last[3]

    def fill(self):
        """The tables of the captures since the last call, into their device buffers (outside any capture)."""
        while self.pending:
            table, entries = self.pending.pop(0)
            table.copy_(torch.tensor(entries, dtype=torch.int64), non_blocking=False)


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


_tables = _Tables()


def captured() -> None:
    """After a CUDA graph capture (dsv4.replay's, each): its commit tables filled in, before its first replay."""
    _tables.fill()


def ready(writes) -> bool:
    """Whether commit can run now: always, but in a CUDA graph capture with no table buffer made before it
    (a capture with no eager step before it; dsv4.replay warms up first), where the per-write path runs."""
    return _tables.ready(len(writes), writes[0].buf.device)


def commit(writes, verdict: torch.Tensor) -> None:
    writes = [w for w in writes if w.rows.shape[0] > 0]
    if not writes:
        return
    device = writes[0].buf.device
    split = min(MAX_SPLIT, next_pow2(max(w.rows.shape[0] for w in writes)))
    table = _tables.get(tuple(_entry(w) for w in writes), device)
    launcher(_commit_step_kernel, writes[0].buf)[(len(writes), split)](table, verdict, SPLIT=split, BLOCK=BLOCK)
