"""Full-token replay is bit-identical to eager (GPU only; skipped on CPU).

`mini` (Flash widths) random weights on one GPU: prime 256 tokens, then 256 sampled steps
(temperature 1, top_p 1, top_k 0, fixed seed) on an eager control and a graph candidate restored
from the same prefix. At every step: the same token, the same logits sha256, the same cache and
hidden digests. The graph is captured once; replays == [256, 256]. The eager step never
synchronises with the host (torch.cuda.set_sync_debug_mode("error")).
"""

from __future__ import annotations

import os

import pytest
import torch

import dsv4
from dsv4.sampler import sample

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PRESET = os.environ.get("DSV4_GPU_PRESET", "mini")
PRIME, OUTPUT = 256, 256
SAMPLING = dsv4.SamplingParams(temperature=1.0, top_p=1.0, top_k=0, seed=20260907)


@pytest.fixture(scope="module")
def model():
    return dsv4.load(PRESET, device="cuda", seed=0)


@pytest.fixture(scope="module")
def prefix(model):
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(2, model.cfg.vocab_size, (PRIME,), generator=g).tolist()
    state = model.new_state(PRIME + OUTPUT + 8)
    model.prefill(state, prompt[:1])
    for t in prompt[1:]:
        model.decode(state, t)
    first = int(sample(state.logits, SAMPLING, PRIME))
    return state, first


def test_eager_step_never_syncs(model, prefix):
    state = model.new_state(prefix[0].capacity)
    state.restore(prefix[0])
    state.input.fill_(prefix[1])
    with torch.inference_mode():
        model.step_device(state, SAMPLING)  # first use of every kernel outside the check
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            model.step_device(state, SAMPLING)
        finally:
            torch.cuda.set_sync_debug_mode("default")


def test_graph_replay_bit_identical_to_eager(model, prefix):
    base, carry = prefix
    control, graph = model.new_state(base.capacity), model.new_state(base.capacity)
    control.restore(base)
    graph.restore(base)
    model.enable_replay(graph, SAMPLING)
    for step in range(OUTPUT):
        expected = model.step(control, carry, SAMPLING)
        actual = model.step(graph, carry, SAMPLING)
        where = f"position {PRIME + step + 1}"
        diff = float((graph.logits - control.logits).abs().max())
        assert model.logits_sha_all(graph) == model.logits_sha_all(control), f"{where}: max |dlogit| {diff}"
        assert actual == expected, where
        assert model.digests_all(graph) == model.digests_all(control), where
        assert model.captures(graph) == 1, where
        carry = expected
    assert model.replay_counts(graph) == [OUTPUT, OUTPUT]
    census = model.graph_census(graph)
    assert census["collectives"] == 2 * model.cfg.num_hidden_layers
    assert census["hc_posts"] == 2 * model.cfg.num_hidden_layers
    assert census["embedding"] == 1 and census["unsupported"] == 0
    # the nodes read from the graph itself (dsv4.graph_nodes), no profiler in the process
    assert census["kernel_nodes"] > 0 and "nodes_uncounted" not in census, census


@pytest.mark.parametrize("fetch", ["kernel", "copy"])
def test_mapped_io_keeps_the_steps(model, prefix, monkeypatch, fetch):
    """dsv4.replay CONFIG mapped_io: a graph that reads its token from and leaves its readback in pinned host memory
    draws the same tokens, logits and states as one with the copies around it (both replayed), one capture each;
    a token outside the vocabulary is refused before the replay, the state unchanged. CONFIG fetch: the token taken
    by the fetch kernel or a memcpy node."""
    from dsv4 import replay

    monkeypatch.setitem(replay.CONFIG, "fetch", fetch)
    base, carry = prefix
    states = {}
    for mapped in (False, True):
        monkeypatch.setitem(replay.CONFIG, "mapped_io", mapped)
        states[mapped] = model.new_state(base.capacity)
        states[mapped].restore(base)
        model.enable_replay(states[mapped], SAMPLING)
        assert (states[mapped].replay.host is not None) == mapped
    for step in range(32):
        tokens = [model.step(states[m], carry, SAMPLING) for m in (False, True)]
        assert tokens[0] == tokens[1], step
        assert model.logits_sha_all(states[True]) == model.logits_sha_all(states[False]), step
        assert model.digests_all(states[True]) == model.digests_all(states[False]), step
        carry = tokens[0]
    mapped = states[True]
    assert model.captures(mapped) == 1 and model.replay_counts(mapped) == [32, 32]
    digest = model.digests_all(mapped)
    with pytest.raises(ValueError):
        model.step(mapped, model.cfg.vocab_size, SAMPLING)
    assert model.digests_all(mapped) == digest and model.replay_counts(mapped) == [32, 32]
    census = model.graph_census(mapped)
    plain = model.graph_census(states[False])
    node = ("kernel_nodes", "memcpy_nodes") if fetch == "kernel" else ("memcpy_nodes", "kernel_nodes")
    assert census[node[0]] == plain[node[0]] + 1 and census[node[1]] == plain[node[1]]  # the fetch


ROWS, STEPS = 4, 48
SAMPLINGS = [dsv4.SamplingParams(temperature=1.0, top_p=0.9 if b % 2 else 1.0, seed=b) for b in range(ROWS)]


@pytest.fixture(scope="module")
def solo_streams(model, prefix):
    """Row b (joining at step b) alone in its own full-token graph: (token, logits sha, digest) a step."""
    base, first = prefix
    expected = []
    for b in range(ROWS):
        state = model.new_state(base.capacity)
        state.restore(base)
        model.enable_replay(state, SAMPLINGS[b])
        carry, stream = first, []
        for _ in range(STEPS - b):
            carry = model.step(state, carry, SAMPLINGS[b])
            stream.append((carry, model.logits_sha(state), state.digest()))
        expected.append(stream)
    return expected


def test_batched_graph_equals_solo_graphs(model, prefix, solo_streams):
    """4 sequences (own seeds, joining at steps 0..3) in one captured batched step against each in its
    own full-token graph: the same tokens, logits, cache and hidden bytes at every step."""
    base, first = prefix
    rows, steps, samplings, expected = ROWS, STEPS, SAMPLINGS, solo_streams
    captures = model.batch_captures()
    states = [model.new_state(base.capacity) for _ in range(rows)]
    for s in states:
        s.restore(base)
    carry = [first] * rows
    for step in range(steps):
        active = [b <= step for b in range(rows)]
        out = model.step_batch(states, carry, samplings, active, graph=True)
        for b in range(rows):
            if active[b]:
                assert (out[b], model.logits_sha(states[b]), states[b].digest()) == expected[b][step - b], \
                    f"row {b} step {step}"
                carry[b] = out[b]
    assert model.batch_captures() == captures + 1


def test_pipelined_batched_graph_equals_solo_graphs(model, prefix, solo_streams):
    """The same rows through the pipelined calls (a server's loop): step N+1 launched, its continuing rows fed
    their last draw on the device, before step N settles. The same tokens at every step, the same logits, cache
    and hidden bytes at the end; the graph captured once."""
    base, first = prefix
    states = [model.new_state(base.capacity) for _ in range(ROWS)]
    for s in states:
        s.restore(base)
    captures = model.batch_captures()
    got = [[] for _ in range(ROWS)]
    launched = []
    for step in range(STEPS + 1):
        if step < STEPS:
            active = [b <= step for b in range(ROWS)]
            feed = [b < step for b in range(ROWS)]  # a row's first step takes the prompt's token from the host
            model.step_batch_launch(states, [None if f else first for f in feed], SAMPLINGS, active, feed, graph=True)
            launched.append(active)
        if step > 0:
            for b, t in enumerate(model.step_batch_settle()):
                if launched[step - 1][b]:
                    got[b].append(t)
    for b in range(ROWS):
        assert got[b] == [e[0] for e in solo_streams[b]], f"row {b}"
        assert (model.logits_sha(states[b]), states[b].digest()) == solo_streams[b][-1][1:], f"row {b}"
    assert model.batch_captures() == captures + 1


def test_a_dead_graph_collected_during_a_capture_does_not_break_it(monkeypatch):
    """replay.capturing: an older graph held only by a dead reference cycle, and the cycle collector set to run at
    nearly every allocation; the capture must still hold (its collect ran before it, and none runs inside it) and
    replay. Without it torch.cuda.graph no longer collects first, and the old graph's destructor inside the capture
    invalidated it (session 48 call 4: a generation's one-row graph after the scheduler's batches)."""
    import gc

    from dsv4 import replay
    from dsv4.replay import capturing

    monkeypatch.setitem(replay.CONFIG, "gc_hold", True)

    x = torch.zeros(8, device="cuda")
    old = torch.cuda.CUDAGraph()
    with torch.cuda.graph(old):
        x.add_(1)
    old.replay()
    cycle = {"graph": old}
    cycle["self"] = cycle
    del old, cycle
    threshold = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        graph = torch.cuda.CUDAGraph()
        with capturing(graph):
            y = x * 2
            for _ in range(200):  # Python allocations: each may start a collection, were one allowed
                _ = [object() for _ in range(4)]
            y.add_(1)
        assert gc.isenabled()
    finally:
        gc.set_threshold(*threshold)
    x.fill_(3)
    graph.replay()
    torch.cuda.synchronize()
    assert y.tolist() == [7.0] * 8
