"""The gate's checks. A failing one raises GateFailure with the check's name, where it failed and
both values (run_gate prints it as GATE_FAIL); the per-rank ones read every rank of the model."""

from __future__ import annotations

import hashlib
import struct

import torch

from ..sampler import uniform


class GateFailure(Exception):
    def __init__(self, check: str, **detail):
        super().__init__(check)
        self.check, self.detail = check, detail


def expect(ok: bool, check: str, **detail):
    if not ok:
        raise GateFailure(check, **detail)


def same(a, b, check: str, **where):
    expect(a == b, check, **where, expected=plain(a), actual=plain(b))


def plain(v):
    """A value as JSON can hold it (tensors as lists)."""
    if isinstance(v, torch.Tensor):
        return v.tolist()
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    return v


def sha256_tokens(tokens: list[int]) -> str:
    h = hashlib.sha256()
    for t in tokens:
        h.update(int(t).to_bytes(4, "little"))
    return h.hexdigest()


def control_sha256(tokens: list[int], prime: int, seed: int) -> str:
    """The seed's host-reconstructed control hash: per position its token, position, u and a zero word."""
    control = hashlib.sha256()
    for i, token in enumerate(tokens):
        control.update((int(token) | ((prime + i) << 32)).to_bytes(8, "little"))
        control.update(struct.pack("<f", uniform(seed, prime + i + 1)))
        control.update((0).to_bytes(8, "little"))
    return control.hexdigest()


def looped(tokens: list[int], max_period: int = 16) -> bool:
    """The stream's tail (its last half, at most 64 tokens) repeats with a period of at most 16."""
    k = min(64, len(tokens) // 2)
    if k < 2 * max_period:
        return False
    tail = tokens[-k:]
    return any(all(tail[i] == tail[i - p] for i in range(p, k)) for p in range(1, max_period + 1))


# ---- per-rank checks -------------------------------------------------------


def identity(model, state) -> list:
    """Per rank: (logits sha256, cache digest, hidden digest, pos)."""
    shas = model.each("logits_sha", state)
    digests = model.each("digests", state)
    return [(s, d[0], d[1], d[2]) for s, d in zip(shas, digests, strict=True)]


def census(model) -> list[torch.Tensor]:
    return [torch.as_tensor(c).clone() for c in model.each("census")]


def check_census(model, before, steps: int, **where):
    """Every rank ran `steps` reductions at every (layer, site) since `before`."""
    layers = model.cfg.num_hidden_layers
    for rank, (b, a) in enumerate(zip(before, census(model), strict=True)):
        delta = a - b
        expect(bool((delta == steps).all()), "collective census", rank=rank, steps=steps, **where,
               expected=f"{steps} per (layer, site), {2 * layers * steps} in all", actual=delta.tolist())


def capture_once(model, state, **where):
    """Every rank captured this state's step once, and the graph holds the whole step (CUDA only)."""
    if model.device.type != "cuda":
        return
    layers = model.cfg.num_hidden_layers
    same([1] * model.world, model.each("captures", state), "captured exactly once", **where)
    for r, graph in enumerate(model.each("graph_census", state)):
        same(2 * layers, graph.get("collectives"), "captured collectives", graph_rank=r, **where)
        same(2 * layers, graph.get("hc_posts"), "captured mHC posts", graph_rank=r, **where)
        same(1, graph.get("embedding"), "captured embedding", graph_rank=r, **where)
        same(0, graph.get("unsupported"), "unsupported graph nodes", graph_rank=r, **where)
