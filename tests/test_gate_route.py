"""The router's gate GEMV and the router in one launch (dsv4.kernels.gate_route) against the two launches it replaces
(dsv4.kernels.dense's linear, then dsv4.kernels.route's kernel): the same logits' ids and weights, bit for bit, alone
and in a batch of rows, hash and top-k layers; in a model's decode steps the same logits and state.

CPU tensors run through Triton's interpreter (conftest); on a GPU the compiled kernels."""

from __future__ import annotations

import pytest
import torch

from dsv4 import kernels
from dsv4.config import preset
from dsv4.kernels import dense, gate_route, qgemv, route
from batching import decode_twice

DEVICES = (["cpu"] if kernels.interpreting() else []) + (["cuda"] if torch.cuda.is_available() else [])
pytestmark = pytest.mark.skipif(not DEVICES or not kernels._triton_available(), reason="needs triton")


def _inputs(T, E, D, k, dtype, hashed, seed, device):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g).to(dtype)
    gate = (torch.randn(E, D, generator=g) / D ** 0.5 * 3).to(dtype)
    bias = torch.randn(E, generator=g) * 0.1
    tokens = torch.randint(0, 1000, (T,), generator=g)
    tid2eid = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(1000)]) if hashed else None
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return to(x), to(gate), to(bias), to(tokens), to(tid2eid)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("hashed", [False, True], ids=["topk", "hash"])
@pytest.mark.parametrize("T", [1, 3, 10])  # 10: two row groups (dense's 8 rows a program), a route ticket each
def test_one_launch_is_the_gate_then_the_router(device, hashed, T):
    dtype = torch.bfloat16
    cfg = preset("flash")
    E, k, D = cfg.n_routed_experts, cfg.num_experts_per_tok, 1024
    qgemv.tickets_for(1, torch.device(device))  # the device's tickets, made outside any capture
    for seed in range(3):
        x, gate, bias, tokens, tid2eid = _inputs(T, E, D, k, dtype, hashed, seed, device)
        assert gate_route.fits(x, gate, 1, cfg.scoring_func)
        splits = dense.tiling(E, D, gate.dtype)[2]
        assert splits > 1  # the split reduction's reducers take the route's tickets
        logits = dense.linear(x, gate, stored=True)
        want = route.route(logits, tokens, None if hashed else bias, tid2eid, k, cfg.norm_topk_prob,
                           cfg.routed_scaling_factor)
        got = gate_route.gate_route(x, gate, tokens, None if hashed else bias, tid2eid, k, cfg.norm_topk_prob,
                                    cfg.routed_scaling_factor, stored=True)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (seed, got, want)
        # the tickets are left zero for the next launch
        assert int(qgemv.tickets_for(1, torch.device(device)).abs().sum()) == 0


@pytest.mark.parametrize("device", DEVICES)
def test_one_split_routes_too(monkeypatch, device):
    """A gate whose tiles make one split (no split reduction): every block's program takes the group's ticket."""
    monkeypatch.setitem(dense.CONFIG, "split_k", 1)
    cfg = preset("flash")
    E, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    x, gate, bias, tokens, _ = _inputs(2, E, 256, k, torch.bfloat16, False, 7, device)
    assert dense.tiling(E, 256, gate.dtype)[2] == 1
    want = route.route(dense.linear(x, gate), tokens, bias, None, k, cfg.norm_topk_prob, cfg.routed_scaling_factor)
    got = gate_route.gate_route(x, gate, tokens, bias, None, k, cfg.norm_topk_prob, cfg.routed_scaling_factor,
                                stored=False)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_what_does_not_fit_is_left_to_the_two_launches(monkeypatch):
    cfg = preset("flash")
    x, gate, bias, _, _ = _inputs(1, 64, 128, 6, torch.bfloat16, False, 0, "cpu")
    assert not gate_route.fits(x.float(), gate.float(), 1, cfg.scoring_func)  # fp32 logits: two launches
    assert not gate_route.fits(x, gate, 1, "softmax")  # another scoring: the reference's
    assert not gate_route.fits(x, gate, 1, cfg.scoring_func, kernel="v3")  # the tensor-core tiles' other sums
    monkeypatch.setitem(gate_route.CONFIG, "on", False)
    assert not gate_route.fits(x, gate, 1, cfg.scoring_func)
    with pytest.raises(ValueError, match="top-k layer needs its bias"):
        gate_route.gate_route(x, gate, torch.zeros(1, dtype=torch.int64), None, None, 6, True, 1.0, stored=True)


@pytest.mark.parametrize("device", DEVICES)
def test_model_steps_with_one_launch_change_no_bit(monkeypatch, device):
    """tiny's decode steps (hash and top-k layers) with gate_route on and off, the rest of the step the same kernels:
    the same logits and state bytes; one gate_route launch a layer a step where it is on."""
    import dsv4

    monkeypatch.setattr(gate_route, "GPU_CHECKED", True)
    model = dsv4.load("tiny", device=device, dtype=torch.bfloat16, seed=3)
    launched = []
    real = gate_route.gate_route
    monkeypatch.setattr(gate_route, "gate_route", lambda *a, **k: launched.append(1) or real(*a, **k))

    def run(on):
        monkeypatch.setitem(gate_route.CONFIG, "on", on)
        return decode_twice(model, monkeypatch)

    (on, on_digest), (off, off_digest) = run(True), run(False)
    assert len(launched) == 2 * model.cfg.num_hidden_layers
    assert torch.equal(on, off) and on_digest == off_digest
