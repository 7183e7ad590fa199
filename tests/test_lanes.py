"""The device's second stream (dsv4.kernels.lanes; layout CONFIG lane): a compressed layer's compressor and indexer
beside the queries' chain, in a captured graph. The split-K tickets are per lane (CPU), and on CUDA the lane changes
no bit: tiny's sampled decode replayed, plain and pooled (attention_pooled), and batched in a graph gives the
one-stream order's tokens, logits and committed bytes; an eager step never takes the lane."""

from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4 import kernels
from dsv4.kernels import lanes, qgemv
from dsv4.kernels import moe as fused_moe
from dsv4.layout import CONFIG as LAYOUT
from dsv4.state import StatePool

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
PROMPTS = [list(range(20, 35)), [7, 8, 9], [(11 * i) % 500 + 1 for i in range(30)]]
SAMPLING = dsv4.SamplingParams(temperature=1.0, seed=11)
STEPS = 20  # tiny's CSA (rate 4) and HCA (rate 16) windows close several times


def test_tickets_are_per_lane(monkeypatch):
    """A launch on the lane counts its splits in a buffer of its own, zeroed, made once; the main stream's is
    unchanged."""
    monkeypatch.setattr(qgemv, "_tickets", {})
    cpu = torch.device("cpu")
    main = qgemv.tickets_for(8, cpu)
    monkeypatch.setattr(lanes, "current", 1)
    lane = qgemv.tickets_for(8, cpu)
    assert lane is not main and lane.shape == main.shape == (qgemv.TICKETS,) and not lane.any()
    assert qgemv.tickets_for(5, cpu) is lane
    monkeypatch.setattr(lanes, "current", 0)
    assert qgemv.tickets_for(5, cpu) is main


def test_beside_is_the_current_stream_off_cuda_or_switched_off():
    """Off (on=False) or on a CPU device the body runs as without lanes: no stream made, the tickets the main
    stream's; `use` says no."""
    assert not lanes.use(torch.device("cpu"), True) and not lanes.use(torch.device("cuda", 0), False)
    seen = []
    with lanes.beside(torch.device("cpu")):
        seen.append(lanes.current)
    with lanes.beside(torch.device("cuda", 0), on=False):  # never touches CUDA
        seen.append(lanes.current)
    lanes.join(torch.device("cpu"))
    lanes.join(torch.device("cuda", 0), on=False)
    assert seen == [0, 0] and lanes.current == 0


@pytest.fixture(scope="module")
def model():
    return dsv4.load("tiny", device="cuda", dtype=torch.bfloat16, seed=6)


def _solo(model, monkeypatch, lane: bool, graph: bool, pooled: bool):
    monkeypatch.setitem(LAYOUT, "lane", lane)
    state = StatePool(model.cfg, 2, 64, model.device, model.dtype).state(1) if pooled else model.new_state(64)
    model.prefill(state, PROMPTS[2])
    if graph:
        model.enable_replay(state, SAMPLING)
    token, tokens, shas = PROMPTS[2][-1], [], []
    for _ in range(STEPS):
        token = model.step(state, token, SAMPLING)
        tokens.append(token)
        shas.append(model.logits_sha(state))
    return tokens, shas, model.digests(state)


@pytest.fixture
def sides(monkeypatch):
    """The `on` of every lanes.beside the model enters (True: its chain ran on the lane)."""
    seen, real = [], lanes.beside
    monkeypatch.setattr(lanes, "beside", lambda device, on=True: seen.append(on) or real(device, on))
    return seen


@cuda
@pytest.mark.parametrize("xproj", [False, True], ids=["indexer", "indexer_and_xproj"])
@pytest.mark.parametrize("pooled", [False, True], ids=["plain", "pooled"])
def test_lane_changes_no_bit_eager_and_graph(model, monkeypatch, sides, pooled, xproj):
    """xproj: the stacked x linear on the lane too (layout CONFIG lane_xproj)."""
    monkeypatch.setitem(LAYOUT, "lane_xproj", xproj)
    base = _solo(model, monkeypatch, False, False, pooled)
    assert _solo(model, monkeypatch, True, False, pooled) == base
    assert sides and not any(sides)  # eager: every compressed layer on the one stream
    sides.clear()
    assert _solo(model, monkeypatch, True, True, pooled) == base
    assert any(sides)  # the capture's compressed layers on the lane
    sides.clear()
    assert _solo(model, monkeypatch, False, True, pooled) == base
    assert sides and not any(sides)


@cuda
@pytest.mark.parametrize("xproj", [False, True], ids=["indexer", "indexer_and_xproj"])
def test_lane_changes_no_bit_in_a_batched_graph(model, monkeypatch, sides, xproj):
    monkeypatch.setitem(LAYOUT, "lane_xproj", xproj)

    def run(lane):
        monkeypatch.setitem(LAYOUT, "lane", lane)
        pool = StatePool(model.cfg, 3, 64, model.device, model.dtype)
        states = [pool.state(slot) for slot in (2, 0, 1)]
        for state, prompt in zip(states, PROMPTS):
            model.prefill(state, prompt)
        tokens, drawn = [p[-1] for p in PROMPTS], []
        for _ in range(STEPS):
            tokens = list(model.step_batch(states, tokens, [SAMPLING] * 3, graph=True))
            drawn.append(tokens)
        return drawn, [model.digests(s) for s in states]

    on = run(True)
    assert any(sides)
    assert on == run(False)


def test_one_stream_keeps_callers_off_the_lane():
    """Inside lanes.one_stream (a profile's graphs, dsv4.replay.TimedReplay) no switch takes the lane, nested or not;
    after it, as before (CPU: use says no either way; the capture below on CUDA)."""
    cpu = torch.device("cpu")
    with lanes.one_stream():
        with lanes.one_stream():
            assert not lanes.use(cpu, True)
        assert lanes._one_stream == 1
    assert lanes._one_stream == 0


@cuda
def test_one_stream_inside_a_capture():
    """While a graph is captured, use() says yes to a switched-on caller, and no inside one_stream."""
    device = torch.device("cuda", torch.cuda.current_device())
    lanes.stream(device)
    x = torch.zeros(4, device=device)
    seen = []
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        seen.append(lanes.use(device, True))
        with lanes.one_stream():
            seen.append(lanes.use(device, True))
        x.add_(1)
    assert seen == [True, False]


# ---- the shared expert beside the routed chain (dsv4.kernels.moe CONFIG shared_lane) ------------------------------


@pytest.fixture(scope="module")
def fp8_tiny(tmp_path_factory):
    """tiny's checkpoint with FP8 linears and FP4 experts: its shared expert takes the fused kernels."""
    from dsv4.checkpoint.synth import synth
    from dsv4.config import preset

    return synth(preset("tiny"), tmp_path_factory.mktemp("lanes") / "tiny", seed=3, quant="fp8")


@pytest.mark.slow  # ~1 min in Triton's interpreter
@pytest.mark.skipif(torch.cuda.is_available() or not kernels.interpreting(),
                    reason="the CPU's kernels (on CUDA the Gluon kernel 1's shared programs have other bits: the "
                           "graph test below)")
def test_shared_expert_apart_changes_no_bit_on_the_cpu_kernels(monkeypatch, fp8_tiny):
    """With shared_lane on, a decode step's shared expert runs as its own chain (gate/up launch, down linear) and the
    routed kernel 1 alone: on the CPU's kernels (moe's pair kernels, whose shared gate/up in the routed launch has the
    bits of its own launch) the logits and state of the one-launch default, bit for bit; every MoE layer of a step
    takes the chain (one stream: no capture)."""
    from batching import decode_twice
    from dsv4.model import moe as model_moe

    model = dsv4.load(fp8_tiny, device="cpu", dtype=torch.bfloat16, tokenizer="stand-in")
    apart = []
    real = model_moe._shared_beside
    monkeypatch.setattr(model_moe, "_shared_beside", lambda *a: apart.append(1) or real(*a))

    def run(on):
        monkeypatch.setitem(fused_moe.CONFIG, "shared_lane", on)
        return decode_twice(model, monkeypatch)

    (on, on_digest), (off, off_digest) = run(True), run(False)
    assert len(apart) == 2 * model.cfg.num_hidden_layers
    assert torch.equal(on, off) and on_digest == off_digest


@cuda
def test_shared_expert_beside_keeps_eager_and_graph_one(monkeypatch, sides, fp8_tiny):
    """shared_lane on: the captured step's shared experts on the lane, eager's on one stream: the same tokens, logits
    and committed bytes."""
    monkeypatch.setitem(fused_moe.CONFIG, "shared_lane", True)
    model = dsv4.load(fp8_tiny, device="cuda", dtype=torch.bfloat16, tokenizer="stand-in")
    eager = _solo(model, monkeypatch, False, False, False)
    assert sides and not any(sides)
    sides.clear()
    assert _solo(model, monkeypatch, False, True, False) == eager
    assert any(sides)  # the capture's shared experts on the lane
