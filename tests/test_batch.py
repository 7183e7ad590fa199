"""Batched decode (Model.step_batch): a sequence's tokens and committed bytes are bit-identical alone
and in a batch of any size with any other sequences, sampled and greedy, on 1 rank and on 2 (gloo).

"Alone" is Model.step on its own state (the solo decode every other test checks against HF); the
batch rows come from one forward over all of them. Bit-identical means equal tokens and equal
digests of every committed buffer, step by step.
"""

from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4 import RefusalError, SamplingParams
from dsv4.checkpoint.synth import synth
from dsv4.config import preset
from dsv4.engine import Batch
from dsv4.sampler import SamplingRows, sample, sample_rows
from dsv4.syncguard import NoHostSync

PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 16, 17, 18], [3], [40, 41], [7, 7, 7, 7], [500, 20, 30],
           [8, 9], [100, 200, 300, 400, 500, 1, 2]]
SAMPLINGS = [SamplingParams(temperature=t, top_p=p, top_k=k, seed=i)
             for i, (t, p, k) in enumerate([(1.0, 1.0, 0), (0.7, 0.9, 5), (0.0, 1.0, 0), (1.3, 0.8, 0),
                                            (1.0, 1.0, 3), (0.5, 0.95, 0), (2.0, 1.0, 0), (0.0, 1.0, 0)])]
STEPS = 12  # enough to cross the tiny model's compression windows (rates 4 and 8)


@pytest.fixture(scope="module")
def model():
    return dsv4.load("tiny", device="cpu")


def prefilled(model, i, capacity=64):
    state = model.new_state(capacity)
    if len(PROMPTS[i]) > 1:
        model.prefill(state, PROMPTS[i][:-1])
    return state


def solo(model, i, steps=STEPS):
    state, token, out, digests = prefilled(model, i), PROMPTS[i][-1], [], []
    for _ in range(steps):
        token = model.step(state, token, SAMPLINGS[i])
        out.append(token)
        digests.append(state.digest())
    return out, digests


@pytest.fixture(scope="module")
def solos(model):
    return [solo(model, i) for i in range(len(PROMPTS))]


@pytest.fixture(params=[False, True], ids=["", "lean"])
def lean(request, monkeypatch):
    """layout CONFIG batch_lean (the step's bookkeeping without its int64 copy and keep-mask clone): the same bits."""
    from dsv4.layout import CONFIG as LAYOUT

    monkeypatch.setitem(LAYOUT, "batch_lean", request.param)
    return request.param


@pytest.mark.parametrize("rows", [[0, 1], [2, 5, 7], list(range(8))])
def test_batched_equals_solo(model, solos, rows, lean):
    states = [prefilled(model, i) for i in rows]
    tokens = [PROMPTS[i][-1] for i in rows]
    for step in range(STEPS):
        tokens = list(model.step_batch(states, tokens, [SAMPLINGS[i] for i in rows]))
        for b, i in enumerate(rows):
            assert tokens[b] == solos[i][0][step], f"sequence {i}, step {step}: batched token differs from solo"
            assert states[b].digest() == solos[i][1][step], f"sequence {i}, step {step}: committed bytes differ"


def test_sequences_join_and_leave_between_steps(model, solos):
    """Each sequence enters the running batch at its own step and leaves after its own count."""
    start = {0: 0, 1: 2, 2: 3, 3: 3, 4: 5, 5: 6, 6: 8, 7: 9}
    length = {i: STEPS - (i % 3) - start[i] // 2 for i in start}
    states, token, done = {}, {}, {i: [] for i in start}
    for step in range(STEPS + 8):
        for i, s in start.items():
            if s == step:
                states[i], token[i] = prefilled(model, i), PROMPTS[i][-1]
        running = [i for i in states if len(done[i]) < length[i]]
        if not running:
            continue
        out = model.step_batch([states[i] for i in running], [token[i] for i in running],
                               [SAMPLINGS[i] for i in running])
        for i, t in zip(running, out):
            token[i] = t
            done[i].append(t)
    for i in start:
        assert done[i] == solos[i][0][:length[i]], f"sequence {i}"


def test_inactive_rows_commit_nothing(model, solos, lean):
    states = [prefilled(model, i) for i in range(3)]
    idle = states[1].digest()
    tokens = [PROMPTS[i][-1] for i in range(3)]
    out = model.step_batch(states, tokens, SAMPLINGS[:3], active=[True, False, True])
    assert out[1] == -1 and out[0] == solos[0][0][0] and out[2] == solos[2][0][0]
    assert states[1].digest() == idle and states[1].host_pos == len(PROMPTS[1]) - 1


def test_refused_batch_commits_nothing_for_any_row(model, lean):
    states = [prefilled(model, i) for i in range(3)]
    before = [s.digest() for s in states]
    model.arm_refusal(1, 0, 7, "moe")
    try:
        with pytest.raises(RefusalError, match="layer 1 site moe"):
            model.step_batch(states, [PROMPTS[i][-1] for i in range(3)], SAMPLINGS[:3])
    finally:
        model.reset_refusals()
    assert [s.digest() for s in states] == before
    for s in states:
        assert s.quarantine is not None
        with pytest.raises(dsv4.QuarantineError):
            model.step(s, 1, SAMPLINGS[0])


def test_bad_batches_are_refused_naming_what(model):
    a, b = model.new_state(8), model.new_state(8)
    with pytest.raises(ValueError, match="2 states, 1 tokens"):
        model.step_batch([a, b], [1], [None, None])
    with pytest.raises(ValueError, match="appears twice"):
        model.step_batch([a, a], [1, 2], [None, None])
    with pytest.raises(ValueError, match="outside"):
        model.step_batch([a, b], [1, model.cfg.vocab_size], [None, None])
    assert a.host_pos == 0 and b.host_pos == 0


def test_capacity_refused_before_any_row_runs(model):
    full, other = model.new_state(1), model.new_state(8)
    model.step(full, 1)
    with pytest.raises(dsv4.CapacityError, match="capacity of 1"):
        model.step_batch([other, full], [1, 2], [None, None])
    assert other.host_pos == 0 and other.digest() == model.new_state(8).digest()


def test_batched_step_makes_no_host_sync(model):
    states = [prefilled(model, i) for i in range(4)]
    batch = Batch(states, model.device)
    batch.input.copy_(torch.tensor([PROMPTS[i][-1] for i in range(4)]))
    batch.active.copy_(torch.tensor([True, True, False, True]))
    batch.rows.load(SAMPLINGS[:4])
    with torch.inference_mode(), NoHostSync():
        model.step_batch_device(batch)


def test_sample_rows_row_equals_sample_alone():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(len(SAMPLINGS), 3000, generator=gen) * 3  # 3 scan rows of 1024
    pos = torch.arange(40, 40 + len(SAMPLINGS))
    rows = SamplingRows(len(SAMPLINGS), "cpu")
    rows.load(SAMPLINGS)
    got = sample_rows(logits, rows, pos)
    for b, p in enumerate(SAMPLINGS):
        assert int(got[b]) == int(sample(logits[b], p, int(pos[b]))), f"row {b} ({p})"
        assert int(got[b]) == int(sample_rows(logits[b:b + 1], _rows([p]), pos[b:b + 1])[0])


def _rows(params):
    rows = SamplingRows(len(params), "cpu")
    rows.load(params)
    return rows


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    ckpt = synth(preset("tiny"), tmp_path_factory.mktemp("batch") / "tiny", seed=5, quant="none")
    model = dsv4.load(ckpt, device="cpu", dtype=torch.float32, ranks=2)
    yield model
    model.close()


def test_two_ranks_batched_equals_solo(two):
    rows = [0, 3, 6]
    expect = {}
    for i in rows:
        state, token, out = prefilled(two, i), PROMPTS[i][-1], []
        for _ in range(6):
            token = two.step(state, token, SAMPLINGS[i])
            out.append((token, state.digest()))
        expect[i] = out
    states = [prefilled(two, i) for i in rows]
    tokens = [PROMPTS[i][-1] for i in rows]
    for step in range(6):
        tokens = list(two.step_batch(states, tokens, [SAMPLINGS[i] for i in rows]))
        for b, i in enumerate(rows):
            assert (tokens[b], states[b].digest()) == expect[i][step], f"sequence {i}, step {step}"
    assert len({d[1] for d in two.digests_all(states[0])}) == 1  # the streams agree on every rank


# ---- pipelined steps (Model.step_batch_launch / step_batch_settle: a server's decode loop) ----------------------
def _pipelined(model, rows, steps, arm=None):
    """rows' sequences stepped with each step launched before the previous one settles, every step after the
    first fed from the device. -> per row, the tokens and the digest after each settled step."""
    states = [prefilled(model, i) for i in rows]
    samplings = [SAMPLINGS[i] for i in rows]
    out = [[] for _ in rows]
    model.step_batch_launch(states, [PROMPTS[i][-1] for i in rows], samplings)
    for step in range(steps):
        if step + 1 < steps:
            model.step_batch_launch(states, [None] * len(rows), samplings, feed=[True] * len(rows))
        for b, t in enumerate(model.step_batch_settle()):
            out[b].append((t, None if step + 1 < steps else states[b].digest()))
    return states, out


@pytest.fixture(params=[False, True], ids=["torch_ends", "fused_ends"])
def ends(request, monkeypatch):
    """A batched step's start and end as torch's ops or as one launch each (kernels.bookkeeping.batch_begin / end,
    the interpreter's on CPU; everything else as the process runs it)."""
    monkeypatch.setattr(dsv4.engine.Model, "_fused_ends", lambda self, batch: request.param)
    return request.param


def test_pipelined_steps_equal_solo(model, solos, ends, lean):
    """Launch N+1 (its inputs read on the device) before settling N: every token is the solo stream's."""
    rows = [0, 1, 4, 7]
    states, out = _pipelined(model, rows, STEPS)
    for b, i in enumerate(rows):
        assert [t for t, _ in out[b]] == solos[i][0], f"sequence {i}"
        assert out[b][-1][1] == solos[i][1][STEPS - 1] and states[b].host_pos == len(PROMPTS[i]) - 1 + STEPS


def test_a_refusal_holds_the_step_launched_behind_it(model, solos, ends, lean):
    """Step N refuses while N+1 is already launched: N quarantines its states; N+1 commits nothing for any row
    (a row that was not in N too) and says so (StepHeld); the joiner then runs on as if nothing happened."""
    states = [prefilled(model, i) for i in range(3)]
    joiner = prefilled(model, 5)
    before = [s.digest() for s in [*states, joiner]]
    model.arm_refusal(1, 0, 7, "moe")
    try:
        model.step_batch_launch(states, [PROMPTS[i][-1] for i in range(3)], SAMPLINGS[:3])
        model.step_batch_launch([*states, joiner], [None, None, None, PROMPTS[5][-1]], [*SAMPLINGS[:3], SAMPLINGS[5]],
                                feed=[True, True, True, False])
        with pytest.raises(RefusalError, match="layer 1 site moe"):
            model.step_batch_settle()
        with pytest.raises(dsv4.StepHeld):
            model.step_batch_settle()
    finally:
        model.reset_refusals()
    assert [s.digest() for s in [*states, joiner]] == before
    assert all(s.quarantine is not None for s in states) and joiner.quarantine is None
    assert joiner.host_pos == len(PROMPTS[5]) - 1 and not bool(model.hold)
    token, got = PROMPTS[5][-1], []
    for _ in range(4):
        token = model.step_batch([joiner], [token], [SAMPLINGS[5]])[0]
        got.append(token)
    assert got == solos[5][0][:4]


def test_pipelined_calls_are_checked(model):
    a = prefilled(model, 0)
    with pytest.raises(RuntimeError, match="no launched step"):
        model.step_batch_settle()
    with pytest.raises(ValueError, match="2 feed flags"):
        model.step_batch_launch([a], [1], [None], feed=[True, False])
    model.step_batch_launch([a], [PROMPTS[0][-1]], [None])
    try:
        with pytest.raises(RuntimeError, match="1 pipelined step"):
            model.step_batch([a], [1], [None])
    finally:
        model.step_batch_settle()


def test_two_ranks_pipelined_equals_solo(two):
    rows = [0, 3]
    expect = {}
    for i in rows:
        state, token, out = prefilled(two, i), PROMPTS[i][-1], []
        for _ in range(5):
            token = two.step(state, token, SAMPLINGS[i])
            out.append(token)
        expect[i] = out
    states, out = _pipelined(two, rows, 5)
    for b, i in enumerate(rows):
        assert [t for t, _ in out[b]] == expect[i], f"sequence {i}"
    assert len({d[1] for d in two.digests_all(states[0])}) == 1


# ---- pipelined_tokens (dsv4.generation: generate's decode loop on CUDA, one step in flight) ---------------------
def test_pipelined_tokens_equal_solo(model, solos):
    """The loop generate runs on CUDA (here eager, graph=False): the solo stream, the state where the solo's is,
    nothing left pending; stopping early settles the step in flight (the state one step past the last token)."""
    from dsv4.generation import pipelined_tokens

    for i in (0, 3):
        state = prefilled(model, i)
        assert list(pipelined_tokens(model, state, PROMPTS[i][-1], STEPS, SAMPLINGS[i], graph=False)) == solos[i][0]
        assert state.digest() == solos[i][1][STEPS - 1] and state.host_pos == len(PROMPTS[i]) - 1 + STEPS
    state = prefilled(model, 1)
    loop = pipelined_tokens(model, state, PROMPTS[1][-1], STEPS, SAMPLINGS[1], graph=False)
    assert [next(loop) for _ in range(3)] == solos[1][0][:3]
    loop.close()
    assert state.digest() == solos[1][1][3] and state.host_pos == len(PROMPTS[1]) - 1 + 4
    assert model.step_batch([state], [solos[1][0][3]], [SAMPLINGS[1]])[0] == solos[1][0][4]  # nothing pending
    assert list(pipelined_tokens(model, prefilled(model, 2), PROMPTS[2][-1], 0, SAMPLINGS[2], graph=False)) == []


def test_pipelined_tokens_refusal_raises_and_leaves_nothing_pending(model, solos):
    """A refused step raises RefusalError from the loop, its state quarantined and unchanged; the step launched
    behind it (held) is settled by the loop, so the model takes the next call."""
    from dsv4.generation import pipelined_tokens

    state = prefilled(model, 4)
    before = state.digest()
    model.arm_refusal(1, 0, 7, "moe")
    try:
        with pytest.raises(RefusalError, match="layer 1 site moe"):
            list(pipelined_tokens(model, state, PROMPTS[4][-1], STEPS, SAMPLINGS[4], graph=False))
    finally:
        model.reset_refusals()
    assert state.quarantine is not None and state.digest() == before and not bool(model.hold)
    other = prefilled(model, 6)
    assert model.step_batch([other], [PROMPTS[6][-1]], [SAMPLINGS[6]])[0] == solos[6][0][0]


def test_two_ranks_pipelined_tokens_equal_solo(two):
    """pipelined_tokens over the driver (its calls forwarded to both ranks): the two ranks' solo stream."""
    from dsv4.generation import pipelined_tokens

    i = 7
    state, token, expect = prefilled(two, i), PROMPTS[i][-1], []
    for _ in range(5):
        token = two.step(state, token, SAMPLINGS[i])
        expect.append(token)
    got = list(pipelined_tokens(two, prefilled(two, i), PROMPTS[i][-1], 5, SAMPLINGS[i], graph=False))
    assert got == expect
