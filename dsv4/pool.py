"""StatePool: the decode states of several sequences stacked along a slot axis, so a batched decode
step reaches every row's caches through one tensor per buffer (issue 12).

Each buffer of a DecodeState is allocated once as [slots, ...] (`DecodeState(..., slots=n)`);
`pool.state(slot)` is a DecodeState whose buffers are that slot's views, so everything that works on a
state (a solo step, its graph, digests, restore, discard) works on it unchanged. When every state of a
one-token step is a view of one pool, the forward takes the pooled path (model.step.PoolStep): the
attention, compressor and indexer kernels read each row's caches through its slot id, one launch for
all rows; its staged writes address the flattened pool buffers; the transaction's bookkeeping is one op
per buffer over the pool's rows.

`Model.new_state` hands out pool slots when DSV4_POOL=n is set (`Pools`: pools of n slots per capacity,
lowest free slot first, a slot freed when its state is collected), so servers, benchmarks and the ranks
of a distributed model get pooled states without another call.
"""

from __future__ import annotations

import os
import weakref

import torch

from .config import ModelConfig
from .state import DecodeState


class StatePool:
    def __init__(self, cfg: ModelConfig, slots: int, capacity: int, device, dtype):
        if not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots {slots!r}: a positive integer")
        self.slots, self.capacity = slots, capacity
        self.store = DecodeState(cfg, capacity, device, dtype, slots=slots)
        self.ids = torch.arange(slots, device=self.store.device)
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
        """The states' slot ids [B] on the device (a slice of `ids` when consecutive, else gathered by a device
        op: capture-safe, no host copy); cached per list of slots."""
        key = tuple(s.slot for s in states)
        ids = self._index.get(key)
        if ids is None:
            if key == tuple(range(key[0], key[0] + len(key))):
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
