"""The fused experts' launch options on `mini` (Flash widths: FP4 experts, an FP8 shared expert) on a GPU:
kernels/moe.py CONFIG gate_up_paired, down_split_experts and shared_launch each leave every byte of a prefill and
sampled steps as with all three off, and with all three on the replayed graph equals eager. (Their kernels' CPU
tests are in test_moe_decode.py and test_moe_decode_options.py; the interpreter is too slow for Flash widths.)

These are the options of moe.py's pair kernels, so the steps run them (moe_gl off, DSV4_MOE_GLUON=0's path): with
moe_gl's kernels on (the default since session 14), shared_launch picks between moe_gl's shared-expert programs in
the routed launch and moe.py's own launch, two summation orders by design (each a row's own, batch-invariant; see
kernels/moe_gl.py), which this test once compared (session 17 call 4: the stale test's failure)."""

from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4.kernels import moe as fused_moe
from dsv4.kernels import moe_gl
from dsv4.sampler import SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="mini on a GPU")]

OPTIONS = ("gate_up_paired", "down_split_experts", "shared_launch")
SP = SamplingParams(temperature=1.0, seed=5)


@pytest.fixture(scope="module")
def mini():
    return dsv4.load("mini", device="cuda")


def run(model, monkeypatch, on: set, graph: bool = False):
    monkeypatch.setitem(moe_gl.CONFIG, "on", False)  # the options are moe.py's kernels'
    for key in OPTIONS:
        monkeypatch.setitem(fused_moe.CONFIG, key, key in on)
    state = model.new_state(64)
    model.prefill(state, list(range(3, 40)))
    if graph:
        model.enable_replay(state, SP)
    token, tokens = model.draw(state, SP), []
    for _ in range(6):
        token = model.step(state, token, SP)
        tokens.append(token)
    out = tokens, model.digests(state), state.logits.clone()
    state.discard()
    return out


def same(a, b) -> bool:
    return a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])


def test_each_option_keeps_the_bits(mini, monkeypatch):
    base = run(mini, monkeypatch, set())
    for on in ({"gate_up_paired"}, {"down_split_experts"}, {"shared_launch"}, set(OPTIONS)):
        assert same(run(mini, monkeypatch, on), base), on


def test_graph_equals_eager_with_all_options(mini, monkeypatch):
    eager = run(mini, monkeypatch, set(OPTIONS))
    assert same(run(mini, monkeypatch, set(OPTIONS), graph=True), eager)
