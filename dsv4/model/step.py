"""What every layer of one step shares, computed once per step rather than once per layer.

A chunk of T tokens at device position `pos`: its positions, the rope tables, which sliding-window
keys each query sees and where its rows land in the ring, and for each compression rate the
geometry of the windows the chunk touches. All of it depends on (pos, T) alone, so the layers of a
step read it from here; everything stays device tensors (no host sync, static shapes).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .. import kernels
from ..kernels import bookkeeping, geometry
from ..kernels.attention import MAX_T
from ..layout import CONFIG as LAYOUT
from .rope import Rope

# A prefill chunk's kernels score a compressed store's rows up to the committed ones rounded up to a
# multiple of this (plus the store's remainder: see Step.scored_rows), so the shapes of a long prompt's
# chunks take few distinct values. A multiple of the kernels' row tiles (index_keys: 32 or 64 rows;
# prefill_attention: CONFIG["block_n"]).
STORE_BLOCK = 256


def store_limit() -> bool:
    """Prefill chunks score only the store rows committed before them (DSV4_PREFILL_STORE_LIMIT=0: the whole
    store). On since session 6: flash, 2 x H200, 32,768 tokens 7.57 -> 6.10 s, logits and every rank's state
    digest equal (benchmarks/RESULTS.md)."""
    return os.environ.get("DSV4_PREFILL_STORE_LIMIT", "1") == "1"


def windows_touched(T: int, m: int) -> int:
    """Most windows a chunk of T tokens can touch, over every alignment of its start."""
    return (T + m - 2) // m + 1


def ring_slots(pos, T: int, R: int, device) -> torch.Tensor:
    """Ring slots (position % R) of the chunk's last min(T, R) tokens: the rows a ring keeps."""
    n = min(T, R)
    return torch.remainder(pos + T - n + torch.arange(n, device=device), R)


@dataclass
class Windows:
    """The windows of rate m a chunk touches, for rings of R rows and stores of `rows` rows.

    Rows of earlier tokens come from the ring, this chunk's from its projections: `cur` / `prev`
    index the stream [ring | chunk] for each window's own positions and the previous window's.
    """

    wids: torch.Tensor  # [n_win] window ids
    closed: torch.Tensor  # [n_win] closed within this chunk
    cur: torch.Tensor  # [n_win, m] stream rows of each window's positions
    prev: torch.Tensor  # [n_win, m] stream rows of the previous window's positions
    prev_live: torch.Tensor  # [n_win, m, 1] the previous window exists (w > 0)
    cos: torch.Tensor  # rope at each window's first position
    sin: torch.Tensor
    slots: torch.Tensor  # ring slots of the rows this chunk leaves in the ring
    store_index: torch.Tensor  # [n_win] store row of each window (id modulo the store's rows)
    committed: torch.Tensor  # [rows] store row holds a closed window
    visible: torch.Tensor  # [T, n_win] window visible to each query: closed and w < (q+1)//m
    store_keep: torch.Tensor  # [n_win] the store write commits: closed (and the sequence's row is active)
    ring_keep: torch.Tensor | None  # [len(slots)] the ring writes commit (None: always, with the verdict)


class Step:
    """One sequence's share of a step. `active` (a 0-dim bool, or None for always): whether this
    sequence's row of a batched step commits; its writes carry it as their keep mask. `host_pos`: the
    host's copy of pos (DecodeState.host_pos), kept for a prefill chunk (T > the decode kernels' MAX_T,
    never graph-captured) when store_limit() is on: its shapes may then follow the position (scored_rows)."""

    def __init__(self, pos: torch.Tensor, T: int, rope: Rope, window: int, active: torch.Tensor | None = None,
                 host_pos: int | None = None):
        self.pos, self.T, self.rope, self.window, self.active = pos, T, rope, window, active
        self.host_pos = host_pos if T > MAX_T and store_limit() else None
        self.device = pos.device
        self._keeps: dict[int, torch.Tensor] = {}
        # A decode step's one position is pos itself (bookkeeping.CONFIG "lean_prologue": a view, no launch; the
        # transaction moves pos only when it settles, after every reader of the positions).
        if T == 1 and bookkeeping.CONFIG["lean_prologue"]:
            self.positions = pos.reshape(1)
        else:
            self.positions = pos + torch.arange(T, device=self.device)
        self._cos_sin: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._windows: dict[tuple[int, int, int], Windows] = {}
        self._sliding = None
        self._verify: VerifyRows | None = None

    def verify_rows(self, R: int) -> "VerifyRows":
        """This one-token step as row 0 of a verify step of R rows at pos, pos + 1, ... (VerifyRows, made once)."""
        if self._verify is None or self._verify.R != R:
            self._verify = VerifyRows(self.pos, R, self.rope, self.window)
        return self._verify

    def cos_sin(self, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
        if kind not in self._cos_sin:
            if self.rope.one_launch(self.positions):  # every kind at once
                self._cos_sin.update(self.rope.cos_sin_kinds(self.positions))
            else:
                self._cos_sin[kind] = self.rope.cos_sin(self.positions, kind)
        return self._cos_sin[kind]

    def keep(self, n: int) -> torch.Tensor | None:
        """The keep mask of a write of n rows with no mask of its own: None, or `active` for each row."""
        if self.active is None:
            return None
        if n == self.active.numel() and LAYOUT["batch_lean"]:  # the mask itself, a view (layout CONFIG batch_lean)
            return self.active.view(n)
        if n not in self._keeps:
            self._keeps[n] = self.active.expand(n).clone()  # a kernel reads it per row: no broadcast strides
        return self._keeps[n]

    def sliding(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(visible [T, W+T] over keys [ring | chunk], ring slots of the chunk's kept rows)."""
        if self._sliding is None and _fused(self.pos, self.T):
            self._sliding = geometry.sliding(self.pos, self.T, self.window)
        if self._sliding is None:
            W, pos = self.window, self.pos
            last = pos - 1
            ring_pos = last - torch.remainder(last - torch.arange(W, device=self.device), W)
            key_pos = torch.cat([ring_pos, self.positions])
            q = self.positions.unsqueeze(-1)
            visible = (key_pos >= 0) & (key_pos <= q) & (key_pos > q - W)
            self._sliding = visible, ring_slots(pos, self.T, W, self.device)
        return self._sliding

    def windows(self, m: int, R: int, rows: int) -> Windows:
        key = (m, R, rows)
        if key not in self._windows:
            self._windows[key] = self._make_windows(m, R, rows)
        return self._windows[key]

    def committed_rows(self, m: int, rows: int) -> int | None:
        """How many rows of a store (rate m, `rows` rows) hold windows closed before the chunk: its committed
        prefix [0, c) (Windows.committed), from the host position; None without one."""
        return None if self.host_pos is None else min(self.host_pos // m, rows)

    def scored_rows(self, m: int, rows: int, tile: int) -> int:
        """The store rows [0, n) a prefill chunk's kernel, of `tile`-row tiles, scores (`rows` without a host
        position): the committed ones rounded up to STORE_BLOCK, plus rows % STORE_BLOCK. So n = rows - k *
        STORE_BLOCK: the rows after the store (the chunk's new windows) keep their offset within every tile
        (STORE_BLOCK a multiple of `tile`), and the tile where the store ends holds no committed row, here
        and in the whole store alike; the rows cut off are uncommitted (invisible to every query)."""
        c = self.committed_rows(m, rows)
        if c is None or STORE_BLOCK % tile:
            return rows
        return min(rows, -(-c // STORE_BLOCK) * STORE_BLOCK + rows % STORE_BLOCK)

    def _make_windows(self, m: int, R: int, rows: int) -> Windows:
        pos, T, dev = self.pos, self.T, self.device
        if _fused(pos, T):
            f = geometry.windows(pos, T, m, R, rows, windows_touched(T, m), active=self.active)
            return _from_kernel(f, self.rope, self.keep(min(T, R)))

        def stream_row(q):  # where position q lives in [ring | chunk]
            return torch.where(q < pos, torch.remainder(q, R), R + (q - pos)).clamp(0, R + T - 1)

        wids = pos // m + torch.arange(windows_touched(T, m), device=dev)
        cur = wids.unsqueeze(-1) * m + torch.arange(m, device=dev)
        cos, sin = self.rope.cos_sin(wids * m, "compress")
        closed = (wids + 1) * m <= pos + T
        return Windows(
            wids=wids, closed=closed, cur=stream_row(cur), prev=stream_row(cur - m),
            prev_live=(cur - m >= 0).unsqueeze(-1), cos=cos, sin=sin, slots=ring_slots(pos, T, R, dev),
            store_index=torch.remainder(wids, rows),
            store_keep=closed if self.active is None else closed & self.active,
            ring_keep=self.keep(min(T, R)),
            committed=torch.arange(rows, device=dev) < pos // m,
            visible=closed.unsqueeze(0) & (wids.unsqueeze(0) < ((self.positions + 1) // m).unsqueeze(-1)))


def _fused(pos: torch.Tensor, T: int) -> bool:
    """Whether a decode step's geometry comes from dsv4.kernels.geometry (one launch per rate and one for the
    sliding window) rather than the torch here (its reference)."""
    return kernels.use_triton(pos, gpu_checked=geometry.GPU_CHECKED) and geometry.supported(pos, T)


def _from_kernel(f: dict, rope: Rope, ring_keep, cos_sin=None) -> Windows:
    """Windows from geometry.windows' fields; the rope tables at the windows' first positions (fp32, as
    rope.cos_sin makes them from the int64 ones)."""
    cos, sin = (cos_sin or rope.cos_sin)(f.pop("starts"), "compress")
    return Windows(**f, cos=cos, sin=sin, ring_keep=ring_keep)


def rows_cos_sin(rope: Rope, positions: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """rope.cos_sin of positions [B] (-> [B, rd/2]) with each row's bits those of the row alone: on CUDA
    one launch (an elementwise op's element does not depend on its neighbours); on CPU row by row, since
    ATen computes a tensor's tail with scalar math and the rest with SIMD (see model/rows.py)."""
    if positions.is_cuda or positions.shape[0] == 1:
        return rope.cos_sin(positions, kind)
    parts = [rope.cos_sin(positions[b:b + 1], kind) for b in range(positions.shape[0])]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


class PoolStep:
    """One token of each of B sequences whose states are the slots `ids` [B] of one StatePool: the Step of
    every row at once, each tensor with a leading row axis. Each row's values are exactly its own Step's
    (T = 1: one window per rate); the indices of the writes address the pool's buffers flattened to
    [slots * rows_per_slot, ...], so one staged write holds every row's."""

    T = 1

    def __init__(self, pos: torch.Tensor, ids: torch.Tensor, rope: Rope, window: int,
                 active: torch.Tensor | None = None):
        self.pos, self.ids, self.rope, self.window, self.active = pos, ids, rope, window, active
        self.device = pos.device
        self.positions = pos
        self._cos_sin: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._windows: dict[tuple[int, int, int], Windows] = {}
        self._sliding = None

    def cos_sin(self, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
        if kind not in self._cos_sin:
            if self.rope.one_launch(self.positions):  # every kind at once; each row its own bits
                self._cos_sin.update(self.rope.cos_sin_kinds(self.positions))
            else:
                self._cos_sin[kind] = rows_cos_sin(self.rope, self.positions, kind)
        return self._cos_sin[kind]

    def keep(self) -> torch.Tensor | None:
        """The keep mask [B] of a write of one row per sequence with no mask of its own."""
        return self.active

    def flat(self, slot_rows: int, row: torch.Tensor) -> torch.Tensor:
        """Row `row` [B] of each sequence's slot, in a pool buffer flattened to [slots * slot_rows, ...]."""
        return self.ids * slot_rows + row

    def sliding(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(visible [B, W + 1] over keys [ring | the row's token], flat ring row of each row's token)."""
        if self._sliding is None and _fused(self.pos, 1):
            self._sliding = geometry.sliding(self.pos, 1, self.window, ids=self.ids)
        if self._sliding is None:
            W, pos = self.window, self.pos.unsqueeze(-1)
            last = pos - 1
            ring_pos = last - torch.remainder(last - torch.arange(W, device=self.device), W)
            key_pos = torch.cat([ring_pos, pos], dim=-1)
            visible = (key_pos >= 0) & (key_pos <= pos) & (key_pos > pos - W)
            self._sliding = visible, self.flat(W, torch.remainder(self.pos, W))
        return self._sliding

    def windows(self, m: int, R: int, rows: int) -> Windows:
        key = (m, R, rows)
        if key not in self._windows:
            self._windows[key] = self._make_windows(m, R, rows)
        return self._windows[key]

    def _make_windows(self, m: int, R: int, rows: int) -> Windows:
        """Step._make_windows for T = 1, per row (the one window holding the token): cur/prev [B, m] index
        each row's stream [its slot's ring | its token]; slots and store_index are flat pool rows."""
        if _fused(self.pos, 1):
            f = geometry.windows(self.pos, 1, m, R, rows, 1, ids=self.ids, active=self.active)
            return _from_kernel(f, self.rope, self.keep(), lambda p, kind: rows_cos_sin(self.rope, p, kind))
        pos, dev = self.pos.unsqueeze(-1), self.device
        wids = self.pos // m
        cur = wids.unsqueeze(-1) * m + torch.arange(m, device=dev)

        def stream_row(q):
            return torch.where(q < pos, torch.remainder(q, R), R + (q - pos)).clamp(0, R)

        cos, sin = rows_cos_sin(self.rope, wids * m, "compress")
        closed = (wids + 1) * m <= self.pos + 1
        return Windows(
            wids=wids, closed=closed, cur=stream_row(cur), prev=stream_row(cur - m),
            prev_live=(cur - m >= 0).unsqueeze(-1), cos=cos, sin=sin,
            slots=self.flat(R, torch.remainder(self.pos, R)), store_index=self.flat(rows, torch.remainder(wids, rows)),
            store_keep=closed if self.active is None else closed & self.active, ring_keep=self.keep(),
            committed=torch.arange(rows, device=dev) < pos // m,
            visible=(closed & (wids < (self.pos + 1) // m)).unsqueeze(-1))


class VerifyRows:
    """The rows of a verify step taken as one chunk (model.attention's verify path, layout CONFIG verify_chunk): one
    sequence's tokens at pos, pos + 1, ..., pos + R - 1, row t the decode step at pos + t once rows 0..t-1 are
    committed. `chunk` (a Step of R tokens) is their compressors' and indexer's geometry: a window's entry is the
    same whoever pools it, from the ring or from the chunk. `each` (a PoolStep of the R positions, every row slot
    0 of the one sequence's caches) is every row's own decode geometry: its rope tables, its window's visible keys and
    ring slot, its committed store rows. Made once a step, shared by its layers."""

    def __init__(self, pos: torch.Tensor, R: int, rope: Rope, window: int):
        self.R = R
        self.chunk = Step(pos, R, rope, window)
        self.each = PoolStep(self.chunk.positions, torch.zeros(R, dtype=torch.int64, device=pos.device), rope, window)
        self.chunk._cos_sin = self.each._cos_sin  # one set of rope tables, made as each row's alone (rows_cos_sin)
        self.order = torch.arange(R, device=pos.device)  # the row behind each of a chunk's ring writes
        self._closers: dict[int, torch.Tensor] = {}

    def closers(self, m: int, windows: Windows) -> torch.Tensor:
        """The row that closes each window of rate m the chunk touches (its store write's row; a window left open,
        whose write keeps nothing, the last row)."""
        if m not in self._closers:
            self._closers[m] = ((windows.wids + 1) * m - 1 - self.chunk.pos).clamp(0, self.R - 1)
        return self._closers[m]
