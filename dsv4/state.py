"""DecodeState: every mutable per-sequence byte, preallocated at `capacity` tokens.

Per layer: the sliding-window K=V ring [window, head_dim] (slot = pos % window).
Per compressed layer (rate m): rings of the last R projected kv/gate rows
(R = 2m for CSA, whose windows overlap; m for HCA) and the compressed rows
[capacity // m + 2, head_dim] (row = window id; the two spare rows keep the
windows one chunk touches distinct modulo the row count). CSA layers also hold
the indexer's rings and compressed keys at index_head_dim.

`pos` is a device scalar (no host sync reads it inside a step); `host_pos`
mirrors it from each step's readback and guards the capacity. Nothing grows.

StatePool (issue 12): the states of several sequences stacked along a slot axis, so a batched decode
step reaches every row's caches through one tensor per buffer. Each buffer is allocated once as
[slots, ...] (`DecodeState(..., slots=n)`); `pool.state(slot)` is a DecodeState whose buffers are that
slot's views (`row`), so everything that works on a state (a solo step, its graph, digests, restore,
discard) works on it unchanged. When every state of a one-token step is a view of one pool, the forward
takes the pooled path (model.step.PoolStep): the attention, compressor and indexer kernels read each
row's caches through its slot id, one launch for all rows; its staged writes address the flattened pool
buffers; the transaction's bookkeeping is one op per buffer over the pool's rows.

`Model.new_state` hands out pool slots when DSV4_POOL=n is set (`Pools`: pools of n slots per capacity,
lowest free slot first, a slot freed when its state is collected), so servers, benchmarks and the ranks
of a distributed model get pooled states without another call.
"""

from __future__ import annotations

import hashlib
import os
import weakref

import torch

from .config import CSA, ModelConfig


class CapacityError(ValueError):
    pass


class QuarantineError(RuntimeError):
    pass


def _bytes(t: torch.Tensor) -> bytes:
    return t.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes()


def _zeros(slots: int | None):
    """torch.zeros, with a leading slot axis when the buffers are a pool's (slots not None)."""
    return lambda *shape, **kw: torch.zeros((() if slots is None else (slots,)) + shape, **kw)


class RefusalError(RuntimeError):
    """A collective of the step refused: nothing was committed and the state is quarantined."""


class StepHeld(RuntimeError):
    """A pipelined batched step launched before an earlier step's refusal was settled: it committed nothing for
    any row (the device's hold masked every row), its states are as before it and open; run it again."""


class LayerCache:
    def __init__(self, cfg: ModelConfig, layer: int, capacity: int, device, dtype, slots: int | None = None):
        hd, W = cfg.head_dim, cfg.sliding_window
        z = dict(device=device, dtype=dtype)
        zeros = _zeros(slots)
        self.win = zeros(W, hd, **z)
        m = cfg.compress_rate(layer)
        if m:
            csa = cfg.layer_types[layer] == CSA
            R, width = (2 * m, 2 * hd) if csa else (m, hd)
            rows = capacity // m + 2
            self.ckv = zeros(R, width, **z)
            self.cgate = zeros(R, width, **z)
            self.comp = zeros(rows, hd, **z)
            if csa:
                dI = cfg.index_head_dim
                self.ikv = zeros(2 * m, 2 * dI, **z)
                self.igate = zeros(2 * m, 2 * dI, **z)
                self.icomp = zeros(rows, dI, **z)

    def buffers(self) -> list[tuple[str, torch.Tensor]]:
        return [(k, v) for k, v in vars(self).items() if isinstance(v, torch.Tensor)]

    def row(self, slot: int) -> "LayerCache":
        """One slot of a stacked cache: a LayerCache of views."""
        view = LayerCache.__new__(LayerCache)
        for k, v in self.buffers():
            setattr(view, k, v[slot])
        return view


class DecodeState:
    def __init__(self, cfg: ModelConfig, capacity: int, device, dtype, slots: int | None = None):
        if not isinstance(capacity, int) or capacity < 1:
            raise CapacityError(f"capacity {capacity!r}: a positive integer of tokens")
        self.cfg, self.capacity, self.device, self.dtype = cfg, capacity, torch.device(device), dtype
        i64 = dict(dtype=torch.int64, device=self.device)
        zeros = _zeros(slots)
        self.pos = zeros(**i64)
        self.host_pos = 0
        self.layers = [LayerCache(cfg, i, capacity, self.device, dtype, slots) for i in range(cfg.num_hidden_layers)]
        self.hidden = zeros(cfg.hc_mult, cfg.hidden_size, device=self.device, dtype=dtype)
        self.logits = zeros(cfg.vocab_size, device=self.device, dtype=torch.float32)
        self.input = zeros(1, **i64)  # the step's input token (static: a graph reads it)
        self.token = zeros(**i64)  # the sampled token
        self.counts = zeros(2, **i64)  # steps run on this state: [forward, commit]
        self.quarantine: str | None = None
        self.replay = None  # a captured full-token graph, set by dsv4.replay
        # prefill chunk lengths -> dsv4.replay.PrefillReplay (or 1: seen once, eagerly), on these buffers
        self.prefill_graphs: dict = {}
        self.pool = None  # the StatePool whose slot `slot` this state is a view of (None: its own)
        self.slot: int | None = None
        # The MTP layers' sliding windows (Model.new_state makes them where the model has MTP layers): the drafter's
        # own cache, outside the committed bytes (a draft is a guess: the stream never depends on it)
        self.mtp_caches: list[LayerCache] = []

    def row(self, slot: int) -> "DecodeState":
        """Slot `slot` of a stacked state (slots=n): a DecodeState of views, starting at position 0."""
        view = DecodeState.__new__(DecodeState)
        vars(view).update(cfg=self.cfg, capacity=self.capacity, device=self.device, dtype=self.dtype, host_pos=0,
                          layers=[layer.row(slot) for layer in self.layers], quarantine=None, replay=None,
                          prefill_graphs={}, pool=None, slot=slot, mtp_caches=[])
        for name in ("pos", "hidden", "logits", "input", "token", "counts"):
            setattr(view, name, getattr(self, name)[slot])
        return view

    def ahead(self, n: "int | torch.Tensor") -> "DecodeState":
        """This state as a step n positions on would see it: the same buffers, pos + n (a new device scalar; n an int
        or a device scalar, whose host_pos is then this state's: a one-token step never reads it). A verify step's
        row n reads the caches through it, once the rows before it have written theirs (dsv4.speculative)."""
        view = DecodeState.__new__(DecodeState)
        vars(view).update(vars(self), pos=self.pos + n, host_pos=self.host_pos + n if isinstance(n, int) else
                          self.host_pos, replay=None, prefill_graphs={}, pool=None)
        return view

    # ---- guards ------------------------------------------------------------
    def check_open(self):
        if self.quarantine is not None:
            raise QuarantineError(f"unfinished transaction: this state is quarantined after "
                                  f"'{self.quarantine}'; discard() it")

    def check_room(self, n: int):
        if self.host_pos + n > self.capacity:
            raise CapacityError(f"{n} more token(s) at position {self.host_pos} exceed the state's capacity "
                                f"of {self.capacity} tokens; nothing was written")

    # ---- committed buffers -------------------------------------------------
    def committed(self) -> list[tuple[str, torch.Tensor]]:
        out = [("pos", self.pos)]
        for i, layer in enumerate(self.layers):
            out += [(f"layers.{i}.{k}", v) for k, v in layer.buffers()]
        return out + [("hidden", self.hidden), ("logits", self.logits), ("token", self.token)]

    def restore(self, other: "DecodeState"):
        """Copy another state's committed buffers into this one, in place (a captured graph stays valid)."""
        self.check_open()
        other.check_open()
        if (other.cfg is not self.cfg and other.cfg != self.cfg) or other.capacity != self.capacity:
            raise ValueError("restore needs a state of the same model and capacity")
        for (_, dst), (_, src) in zip(self.committed(), other.committed(), strict=True):
            dst.copy_(src)
        for dst, src in zip(self.mtp_caches, other.mtp_caches):  # the drafter's window too, where both have one
            dst.win.copy_(src.win)
        self.host_pos = other.host_pos

    def digest(self) -> tuple[str, str, int]:
        """(cache digest, hidden digest, pos): sha256 of the committed bytes; equal bytes, equal digests."""
        cache = hashlib.sha256()
        for name, t in self.committed():
            if name in ("hidden", "logits", "token"):
                continue
            cache.update(name.encode())
            cache.update(_bytes(t))
        hidden = hashlib.sha256(_bytes(self.hidden))
        return cache.hexdigest()[:32], hidden.hexdigest()[:32], int(self.pos)

    def discard(self):
        """End a quarantine (and free the graph): the state's bytes are not to be trusted, so they are zeroed."""
        for _, t in self.committed():
            t.zero_()
        for cache in self.mtp_caches:
            cache.win.zero_()
        self.host_pos = 0
        self.quarantine = None


def state_bytes(cfg: ModelConfig, capacity: int, dtype) -> int:
    """The bytes of one DecodeState of `capacity` tokens (its committed buffers; a rank's copy), counted on the meta
    device: nothing allocated (what a server's slots and prefix cache will hold)."""
    state = DecodeState(cfg, capacity, torch.device("meta"), dtype)
    return sum(t.numel() * t.element_size() for _, t in state.committed())


class StatePool:
    def __init__(self, cfg: ModelConfig, slots: int, capacity: int, device, dtype):
        if not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots {slots!r}: a positive integer")
        self.slots, self.capacity = slots, capacity
        self.store = DecodeState(cfg, capacity, device, dtype, slots=slots)
        self.ids = torch.arange(slots, device=self.store.device)
        # each slot's id alone, 16-byte aligned (stride 2): Triton compiles a kernel per alignment of its
        # pointers, so a solo step's kernels are the same whatever its slot (a graph's warm-up on a scratch
        # state in another slot compiles what its capture runs)
        self._alone = self.ids.repeat_interleave(2)
        self._free = list(range(slots))
        self._index: dict[tuple[int, ...], torch.Tensor] = {}

    def state(self, slot: int) -> DecodeState:
        """The DecodeState of slot `slot` (views of the pool's buffers)."""
        if not 0 <= slot < self.slots:
            raise IndexError(f"slot {slot} of a pool of {self.slots}")
        view = self.store.row(slot)
        view.pool = self
        return view

    def acquire(self) -> DecodeState | None:
        """The lowest free slot's state, zeroed (a fresh state); None when every slot is taken. The slot is
        free again once the state is collected."""
        if not self._free:
            return None
        slot = self._free.pop(0)
        for t in self._buffers():
            t[slot].zero_()
        view = self.state(slot)
        weakref.finalize(view, self._release, slot)
        return view

    def _release(self, slot: int):
        self._free.append(slot)
        self._free.sort()

    def _buffers(self) -> list[torch.Tensor]:
        s = self.store
        return [t for _, t in s.committed()] + [s.input, s.counts]

    def index(self, states: list[DecodeState]) -> torch.Tensor:
        """The states' slot ids [B] on the device, cached per list of slots. One slot, or consecutive slots: a
        view of ids made at the pool's creation (nothing to run, so valid even when first asked for inside a
        graph capture). Others: gathered by a device op the first time (a batch's graph warms up eagerly on
        its own states first, so it is made before the capture)."""
        key = tuple(s.slot for s in states)
        ids = self._index.get(key)
        if ids is None:
            if len(key) == 1:
                ids = self._alone[2 * key[0]:2 * key[0] + 1]
            elif key == tuple(range(key[0], key[0] + len(key))):
                ids = self.ids[key[0]:key[0] + len(key)]
            else:
                ids = torch.stack([self.ids[k] for k in key])
            self._index[key] = ids
        return ids


def pool_of(states: list[DecodeState]) -> StatePool | None:
    """The pool every state is a view of (each in its own slot), or None."""
    pool = states[0].pool
    if pool is None or any(s.pool is not pool for s in states) or len({s.slot for s in states}) != len(states):
        return None
    return pool


class Pools:
    """Model.new_state under DSV4_POOL=n: states from pools of n slots, one list of pools per capacity."""

    def __init__(self, slots: int, cfg: ModelConfig, device, dtype):
        self.slots, self.cfg, self.device, self.dtype = slots, cfg, device, dtype
        self.by_capacity: dict[int, list[StatePool]] = {}

    @staticmethod
    def from_env(cfg: ModelConfig, device, dtype) -> "Pools | None":
        value = os.environ.get("DSV4_POOL", "0")
        if not value.isdigit():
            raise ValueError(f"DSV4_POOL={value!r}: a number of slots per pool (0: no pools)")
        return Pools(int(value), cfg, device, dtype) if int(value) else None

    def new_state(self, capacity: int) -> DecodeState:
        pools = self.by_capacity.setdefault(capacity, [])
        for pool in pools:
            state = pool.acquire()
            if state is not None:
                return state
        pools.append(StatePool(self.cfg, self.slots, capacity, self.device, self.dtype))
        return pools[-1].acquire()
