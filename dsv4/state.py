"""DecodeState: every mutable per-sequence byte, preallocated at `capacity` tokens.

Per layer: the sliding-window K=V ring [window, head_dim] (slot = pos % window).
Per compressed layer (rate m): rings of the last R projected kv/gate rows
(R = 2m for CSA, whose windows overlap; m for HCA) and the compressed rows
[capacity // m + 2, head_dim] (row = window id; the two spare rows keep the
windows one chunk touches distinct modulo the row count). CSA layers also hold
the indexer's rings and compressed keys at index_head_dim.

`pos` is a device scalar (no host sync reads it inside a step); `host_pos`
mirrors it from each step's readback and guards the capacity. Nothing grows.

`slots=n` stacks n states' buffers along a leading slot axis (the storage of a dsv4.pool.StatePool);
`row(slot)` is then the DecodeState whose every buffer is that slot's view, so whatever works on a
DecodeState (steps, graphs, digests, restore, discard) works on it unchanged.
"""

from __future__ import annotations

import hashlib

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
        self.pool = None  # the dsv4.pool.StatePool whose slot `slot` this state is a view of (None: its own)
        self.slot: int | None = None

    def row(self, slot: int) -> "DecodeState":
        """Slot `slot` of a stacked state (slots=n): a DecodeState of views, starting at position 0."""
        view = DecodeState.__new__(DecodeState)
        vars(view).update(cfg=self.cfg, capacity=self.capacity, device=self.device, dtype=self.dtype, host_pos=0,
                          layers=[layer.row(slot) for layer in self.layers], quarantine=None, replay=None,
                          pool=None, slot=slot)
        for name in ("pos", "hidden", "logits", "input", "token", "counts"):
            setattr(view, name, getattr(self, name)[slot])
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
        self.host_pos = 0
        self.quarantine = None
