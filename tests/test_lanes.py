"""The side lane (dsv4.model.lanes): a compressed layer's compressors and indexer on a second stream.

CPU: a Fork changes nothing (one stream) and the split tickets are kept per lane. GPU (mini, Flash widths): with
the lanes on, a prefill and sampled steps leave every byte as with them off, in eager steps, in the replayed graph
(the fork and join captured) and in a pooled batched step (attention_pooled)."""

from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4 import kernels
from dsv4.kernels import qgemv
from dsv4.model import lanes
from dsv4.sampler import SamplingParams
from dsv4.state import StatePool

SP = SamplingParams(temperature=1.0, seed=9)


def test_tickets_are_per_lane(monkeypatch):
    monkeypatch.setattr(qgemv, "_tickets", {})
    cpu = torch.device("cpu")
    main = qgemv.tickets_for(8, cpu)
    kernels.LANE[0] = 1
    try:
        side = qgemv.tickets_for(8, cpu)
        assert side is not None and side.data_ptr() != main.data_ptr()
        assert qgemv.tickets_for(8, cpu) is side
    finally:
        kernels.LANE[0] = 0
    assert qgemv.tickets_for(8, cpu) is main


def test_fork_on_cpu_is_one_stream(monkeypatch):
    monkeypatch.setitem(lanes.CONFIG, "overlap", True)
    fork = lanes.Fork(torch.zeros(2))
    with fork:
        assert kernels.LANE[0] == 0
    fork.join()
    assert not fork.on


def run(model, monkeypatch, overlap: bool, graph: bool = False):
    monkeypatch.setitem(lanes.CONFIG, "overlap", overlap)
    state = model.new_state(96)
    model.prefill(state, list(range(3, 70)))
    if graph:
        model.enable_replay(state, SP)
    token, tokens = model.draw(state, SP), []
    for _ in range(8):
        token = model.step(state, token, SP)
        tokens.append(token)
    out = tokens, model.digests(state), state.logits.clone()
    state.discard()
    return out


def same(a, b) -> bool:
    return a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])




@pytest.fixture(scope="module")
def mini():
    return dsv4.load("mini", device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="mini on a GPU")
def test_side_lane_keeps_the_bits_eager_and_graph(mini, monkeypatch):
    base = run(mini, monkeypatch, False)
    assert same(run(mini, monkeypatch, True), base)
    assert same(run(mini, monkeypatch, True, graph=True), base)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="mini on a GPU")
def test_side_lane_keeps_the_bits_of_a_batched_step(mini, monkeypatch):
    def batch(overlap: bool):
        monkeypatch.setitem(lanes.CONFIG, "overlap", overlap)
        pool = StatePool(mini.cfg, 3, 96, mini.device, mini.dtype)  # the pooled step: attention_pooled
        states = [pool.state(i) for i in range(3)]
        for i, s in enumerate(states):
            mini.prefill(s, list(range(3 + i, 40 + 5 * i)))
        samplings = [SamplingParams(temperature=1.0, seed=20 + i) for i in range(3)]
        tokens = [mini.draw(s, sp) for s, sp in zip(states, samplings)]
        out = []
        for _ in range(6):
            tokens = list(mini.step_batch(states, tokens, samplings))
            out.append(tuple(tokens))
        return out, [s.digest() for s in states]

    assert batch(True) == batch(False)
