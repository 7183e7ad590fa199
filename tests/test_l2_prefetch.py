"""The weights' L2 prefetch (dsv4.kernels.l2_prefetch): what it asks for, and that it changes no bit of a step.

CPU: plan's byte views (order, the budget's cut, 16-byte ends, a QWeight's data then its scale). GPU (mini): with
DSV4_L2_PREFETCH's budget on, eager steps give the logits and tokens of steps without it, and so does the replayed
graph, whose census holds the prefetch launches (a branch of the captured step); the eager step never syncs.
"""

from __future__ import annotations

import os

import pytest
import torch

import dsv4
from dsv4.sampler import sample
from dsv4.formats import QWeight
from dsv4.kernels import l2_prefetch

SAMPLING = dsv4.SamplingParams(temperature=1.0, top_p=1.0, top_k=0, seed=20261203)
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_plan_orders_cuts_and_aligns():
    a = torch.zeros(1001, dtype=torch.bfloat16)  # 2,002 bytes
    q = QWeight(torch.zeros(64, 64, dtype=torch.float8_e4m3fn), torch.ones(1, 1), "fp8")  # 4,096 bytes (its scale left)
    views = l2_prefetch.plan([a, q], 1 << 20)
    assert [v.numel() for v in views] == [2000, 4096]  # a cut to its last whole 16 bytes
    assert views[0].data_ptr() == a.data_ptr() and views[1].data_ptr() == q.data.data_ptr()
    assert all(v.dtype == torch.uint8 for v in views)
    cut = l2_prefetch.plan([a, q], 2100)
    assert [v.numel() for v in cut] == [2000, 96]  # the budget runs out inside q's data, cut to 16 bytes
    assert l2_prefetch.plan([a[1:]], 1 << 20) == []  # its start 2 bytes past an aligned one: not asked for
    assert l2_prefetch.plan([torch.zeros(8, 8).t()], 1 << 20) == []  # not contiguous: no one byte range
    assert l2_prefetch.plan([a], 8) == []


def test_off_by_default_and_nothing_on_cpu(monkeypatch):
    if "DSV4_L2_PREFETCH" not in os.environ:
        assert not l2_prefetch.on()
    monkeypatch.setitem(l2_prefetch.CONFIG, "budget_mb", 32.0)
    l2_prefetch.ahead([torch.zeros(4096, dtype=torch.uint8)], torch.device("cpu"), "moe")
    assert not l2_prefetch._forked
    with pytest.raises(ValueError, match="site 'head'"):
        l2_prefetch.ahead([], torch.device("cpu"), "head")


@pytest.fixture(scope="module")
def model():
    return dsv4.load("mini", device="cuda", seed=0)


def _run(model, prompt, steps: int, replay: bool):
    state = model.new_state(len(prompt) + steps + 8)
    model.prefill(state, prompt)
    if replay:
        model.enable_replay(state, SAMPLING)
    token, shas, tokens = int(sample(state.logits, SAMPLING, len(prompt))), [], []
    for _ in range(steps):
        token = model.step(state, token, SAMPLING)
        shas.append(model.logits_sha_all(state))
        tokens.append(token)
    return shas, tokens, model.graph_census(state)


@gpu
@pytest.mark.gpu
def test_prefetch_keeps_every_bit(model, monkeypatch):
    prompt = torch.randint(2, model.cfg.vocab_size, (24,), generator=torch.Generator().manual_seed(3)).tolist()
    monkeypatch.setitem(l2_prefetch.CONFIG, "budget_mb", 0.0)
    off = _run(model, prompt, 12, replay=False)
    off_graph = _run(model, prompt, 12, replay=True)
    monkeypatch.setitem(l2_prefetch.CONFIG, "budget_mb", 32.0)
    on = _run(model, prompt, 12, replay=False)
    assert l2_prefetch._side and not l2_prefetch._forked  # it ran, and every fork joined
    on_graph = _run(model, prompt, 12, replay=True)
    assert on[:2] == off[:2] == off_graph[:2] == on_graph[:2]
    # the prefetch launches are nodes of the captured step (session 28 call 2: 145 -> 168 on mini, 4 forks a layer
    # less the one whose weights the budget left none of)
    layers = model.cfg.num_hidden_layers
    assert 3 * layers <= on_graph[2]["kernel_nodes"] - off_graph[2]["kernel_nodes"] <= 4 * layers, \
        (on_graph[2], off_graph[2])


@gpu
@pytest.mark.gpu
def test_eager_step_with_prefetch_never_syncs(model, monkeypatch):
    monkeypatch.setitem(l2_prefetch.CONFIG, "budget_mb", 32.0)
    state = model.new_state(64)
    model.prefill(state, [5, 6, 7])
    state.input.fill_(9)
    with torch.inference_mode():
        model.step_device(state, SAMPLING)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            model.step_device(state, SAMPLING)
        finally:
            torch.cuda.set_sync_debug_mode("default")
