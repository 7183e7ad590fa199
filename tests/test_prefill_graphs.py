"""A state's short prefill chunks replayed from CUDA graphs (DSV4_PREFILL_GRAPHS, dsv4.replay.PrefillReplay) give
the eager prefill's bits (GPU only; skipped on CPU).

`tiny` and `mini` random weights on one GPU. A prompt prefilled in chunks of one length, on a state with the graphs
(its first chunk of a length eager, its second captured and replayed, the others replayed) and on one without
(eager, store-limited: the process's default path): after every chunk the same logits and the same committed
state (its digest), then decode steps on both the same. The graphs stay valid across requests on the same buffers
(a state restored to empty and prefilled again replays without a capture: a server slot's next request), and a
refusal fired inside a replayed chunk commits nothing and quarantines the state.
"""

from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4.replay import PrefillReplay
from dsv4.state import RefusalError

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module", params=["tiny", "mini"])
def model(request):
    return dsv4.load(request.param, device="cuda", seed=0)


def prompt(model, n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, model.cfg.vocab_size, (n,), generator=g).tolist()


def chunks(ids: list[int], size: int) -> list[list[int]]:
    return [ids[i:i + size] for i in range(0, len(ids), size)]


@pytest.mark.parametrize("size", [16, 63])
def test_replayed_chunks_equal_eager(model, size):
    ids = prompt(model, 4 * size + 5, seed=size)
    cap = len(ids) + 16
    graphed, eager = model.new_state(cap), model.new_state(cap)
    for chunk in chunks(ids, size):
        model.prefill_graphs = True
        try:
            got = model.prefill(graphed, chunk, chunk_size=len(chunk))
        finally:
            model.prefill_graphs = False
        want = model.prefill(eager, chunk, chunk_size=len(chunk))
        assert torch.equal(got, want)
        assert graphed.digest() == eager.digest() and graphed.host_pos == eager.host_pos
    graph = graphed.prefill_graphs[size]
    assert isinstance(graph, PrefillReplay) and graph.replays == 3  # chunks 2-4 (chunk 1 eager, the tail eager)
    assert graphed.prefill_graphs[5] == 1
    token = ids[-1]
    for _ in range(4):
        a, b = model.decode(graphed, token), model.decode(eager, token)
        assert torch.equal(a, b) and graphed.digest() == eager.digest()
        token = int(a.argmax())


def test_graph_serves_the_next_request_on_the_same_buffers(model):
    size = 24
    cap = 3 * size + 8
    state, eager, empty = model.new_state(cap), model.new_state(cap), model.new_state(cap)
    model.prefill_graphs = True
    try:
        model.prefill(state, prompt(model, 2 * size, seed=1), chunk_size=size)  # eager, then captured
        graph = state.prefill_graphs[size]
        assert isinstance(graph, PrefillReplay) and graph.replays == 1
        state.restore(empty)  # the slot's next request
        second = prompt(model, 3 * size, seed=2)
        got = model.prefill(state, second, chunk_size=size)
    finally:
        model.prefill_graphs = False
    assert state.prefill_graphs[size] is graph and graph.replays == 4
    want = model.prefill(eager, second, chunk_size=size)
    assert torch.equal(got, want) and state.digest() == eager.digest()


def test_refusal_inside_a_replayed_chunk_commits_nothing(model):
    size = 20
    ids = prompt(model, 3 * size, seed=3)
    state = model.new_state(len(ids) + 8)
    model.prefill_graphs = True
    try:
        model.prefill(state, ids[:2 * size], chunk_size=size)  # the graph exists and has run
        before, pos = state.digest(), state.host_pos
        replays = state.prefill_graphs[size].replays
        model.arm_refusal(model.cfg.num_hidden_layers - 1, 0, 9, "moe")
        try:
            with pytest.raises(RefusalError, match="site moe"):
                model.prefill(state, ids[2 * size:], chunk_size=size)
        finally:
            model.reset_refusals()
    finally:
        model.prefill_graphs = False
    assert state.prefill_graphs[size].replays == replays + 1  # the refusal fired inside the replay
    assert state.digest() == before and state.host_pos == pos
    assert state.quarantine is not None
    with pytest.raises(dsv4.QuarantineError):
        model.prefill(state, ids[:1])


def test_prefill_batch_of_one_state_takes_its_graph(model):
    size = 32
    ids = prompt(model, 2 * size, seed=4)
    a, b = model.new_state(len(ids) + 8), model.new_state(len(ids) + 8)
    model.prefill_graphs = True
    try:
        for chunk in chunks(ids, size):
            got = model.prefill_batch([a], [chunk])
            want = model.prefill_batch([b, model.new_state(len(ids) + 8)], [chunk, chunk])[:1]
            assert torch.equal(got, want)
    finally:
        model.prefill_graphs = False
    assert a.prefill_graphs[size].replays == 1 and a.digest() == b.digest()
