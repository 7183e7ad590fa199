"""dsv4.kernels.prefetch (DSV4_L2_PREFETCH): weights asked into L2 on a side stream change no value. On CPU it does
nothing; on a GPU the replayed graph (whose side branch holds the prefetches) samples eager's stream bit for bit."""

from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4.formats import QWeight
from dsv4.kernels import prefetch

SAMPLING = dsv4.SamplingParams(temperature=1.0, seed=20261203)


def test_nothing_on_cpu(monkeypatch):
    monkeypatch.setitem(prefetch.CONFIG, "on", True)
    prefetch.l2(torch.zeros(64), QWeight(torch.zeros(4, 8, dtype=torch.int8), torch.zeros(4, 1), "fp4"), None)
    assert not prefetch._forked and not prefetch._side


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_prefetched_steps_equal_eager(monkeypatch):
    """mini with the prefetches on: the graph arm (model.step replayed) and generate's pipelined loop sample the
    eager step's stream (prefetches off) over 24 tokens; the side stream joined at each step's end."""
    model = dsv4.load("mini", device="cuda", seed=0)
    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(2, model.cfg.vocab_size, (32,), generator=g).tolist()

    def stream(graph: bool):
        state = model.new_state(len(prompt) + 24)
        model.prefill(state, prompt[:-1])
        if graph:
            model.enable_replay(state, SAMPLING)
        token, out = prompt[-1], []
        for _ in range(24):
            token = model.step(state, token, SAMPLING)
            out.append(token)
        return out, state.digest()

    eager = stream(False)
    monkeypatch.setitem(prefetch.CONFIG, "on", True)
    assert stream(False) == eager
    assert stream(True) == eager
    assert list(model.sample_tokens(prompt, 24, SAMPLING)) == eager[0]
    assert not prefetch._forked and prefetch._side  # it ran, and every fork was joined
