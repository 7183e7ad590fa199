"""Speculative decoding (Model.verify, dsv4.speculative): the stream is the plain step loop's, bit for bit.

"Plain" is Model.step on its own state (the decode every other test checks against HF). A verify step's row j must
be the decode step at pos + j: the same draw, and after the step the same committed bytes (DecodeState.digest) and
the same stored logits as that many model.step calls, whatever was drafted. The tiny model's compression rates (4
and 8) and sliding window (8) make verify steps close windows and wrap the rings.
"""

from __future__ import annotations

import hashlib

import pytest
import torch

import dsv4
from dsv4 import RefusalError, SamplingParams
from dsv4 import speculative as spec
from dsv4.checkpoint.synth import synth
from dsv4.config import preset
from dsv4.state import CapacityError

PROMPT = [5, 9, 3, 7, 5, 9, 3, 7, 1, 2]
SAMPLINGS = [SamplingParams(temperature=1.0, seed=3), SamplingParams(temperature=0.7, top_p=0.9, top_k=5, seed=11),
             SamplingParams.greedy()]
STEPS = 24


@pytest.fixture(scope="module")
def model():
    return dsv4.load("tiny", device="cpu")


def prefilled(model, prompt=PROMPT, capacity=64):
    state = model.new_state(capacity)
    model.prefill(state, prompt[:-1])
    return state


def logits_sha(state) -> str:
    return hashlib.sha256(state.logits.numpy().tobytes()).hexdigest()


def plain(model, sampling, steps=STEPS, prompt=PROMPT):
    """model.step's tokens and, after each step, (digest, logits sha, the state's token)."""
    state, token, tokens, after = prefilled(model, prompt), prompt[-1], [], []
    for _ in range(steps):
        token = model.step(state, token, sampling)
        tokens.append(token)
        after.append((state.digest(), logits_sha(state), int(state.token)))
    return tokens, after


@pytest.fixture(scope="module")
def plains(model):
    return [plain(model, s) for s in SAMPLINGS]


@pytest.mark.parametrize("s", range(len(SAMPLINGS)))
@pytest.mark.parametrize("k", [1, 3, 7])
def test_verify_rows_are_decode_steps(model, plains, s, k):
    """Every draft right: each verify step yields k + 1 tokens, and the state after it is the plain state after as
    many steps (every offset of the windows crossed, as k + 1 and the rates 4 and 8 are coprime or not)."""
    tokens, after = plains[s]
    state, token, done = prefilled(model), PROMPT[-1], 0
    while done + k + 1 <= STEPS:
        got = model.verify(state, token, tokens[done:done + k], SAMPLINGS[s])
        assert list(got) == tokens[done:done + k + 1]
        done += k + 1
        assert (state.digest(), logits_sha(state), int(state.token)) == after[done - 1], f"after {done} tokens"
        assert state.host_pos == len(PROMPT) - 1 + done and int(state.pos) == state.host_pos
        token = got[-1]


@pytest.mark.parametrize("wrong", [0, 1, 2, 4])
def test_rejected_rows_are_taken_back(model, plains, wrong):
    """Draft `wrong` differs from the plain token: the step yields the tokens up to and including the draw there
    (wrong + 1), and the state is the plain state after as many steps; stepping on from it continues the plain
    stream."""
    tokens, after = plains[0]
    start = 3
    state, token = prefilled(model), PROMPT[-1]
    for t in tokens[:start]:
        token = model.step(state, token, SAMPLINGS[0])
    drafts = list(tokens[start:start + 5])
    drafts[wrong] = (drafts[wrong] + 1) % model.cfg.vocab_size
    got = model.verify(state, token, drafts, SAMPLINGS[0])
    assert list(got) == tokens[start:start + wrong + 1]
    assert (state.digest(), logits_sha(state), int(state.token)) == after[start + wrong]
    token = got[-1]
    for i in range(start + wrong + 1, STEPS):
        token = model.step(state, token, SAMPLINGS[0])
        assert (token, state.digest()) == (tokens[i], after[i][0])


class Flipper:
    """Drafts the plain stream with every third token wrong (accepted runs, then a rejection)."""

    def __init__(self, prompt, script, vocab):
        self.inner = spec.ScriptedDrafter(prompt, [(t + (i % 3 == 2)) % vocab for i, t in enumerate(script)])

    def propose(self, context, k):
        return self.inner.propose(context, k)


@pytest.mark.parametrize("s", range(len(SAMPLINGS)))
@pytest.mark.parametrize("drafter", ["script", "flipper", "ngram"])
def test_speculative_stream_is_the_plain_stream(model, plains, s, drafter):
    tokens = plains[s][0]
    make = {"script": lambda: spec.ScriptedDrafter(len(PROMPT), tokens),
            "flipper": lambda: Flipper(len(PROMPT), tokens, model.cfg.vocab_size),
            "ngram": lambda: spec.NgramDrafter()}[drafter]
    tally = spec.Tally()
    got = list(spec.sample_tokens(model, PROMPT, STEPS, SAMPLINGS[s], drafter=make(), k=4, tally=tally))
    assert got == tokens == list(model.sample_tokens(PROMPT, STEPS, SAMPLINGS[s]))
    assert tally.tokens == STEPS and tally.accepted == STEPS - tally.steps
    if drafter == "script":  # every draft accepted: ceil(24 / 5) steps
        assert tally.steps == 5 and tally.acceptance == 1.0
    if drafter == "flipper":
        assert 0 < tally.acceptance < 1


def test_padded_drafts_keep_the_plain_stream(model, plains, monkeypatch):
    """CONFIG pad (graphs: a short proposal padded to k so the full verify graph replays; on CPU graph=True runs the
    same steps eagerly): the n-gram drafter's stream is the plain one, every step but the budget's last ones verifies
    exactly k drafts, and a pad is the proposal's last token (the context's when it is empty)."""
    assert spec.padded([], 3, 9) == [9, 9, 9] and spec.padded([4, 5], 4, 9) == [4, 5, 5, 5] and \
        spec.padded([1, 2], 2, 9) == [1, 2]
    monkeypatch.setitem(spec.CONFIG, "pad", True)
    tokens = plains[0][0]
    tally, k = spec.Tally(), 3
    got = list(spec.sample_tokens(model, PROMPT, STEPS, SAMPLINGS[0], drafter=spec.NgramDrafter(), k=k, tally=tally,
                                  graph=True))
    assert got == tokens
    assert tally.tokens == STEPS and tally.proposed >= k * (tally.steps - k)  # only the last k steps may be short


def test_a_stop_token_ends_the_stream_where_plain_stops(model, plains):
    """The first stop drawn is the last token yielded; the rows drafted past it are never committed."""
    tokens, after = plains[0]
    stop = tokens[6]
    first = tokens.index(stop)
    state, token = prefilled(model), PROMPT[-1]
    got = model.verify(state, token, tokens[:7], SAMPLINGS[0], stops=[stop])
    assert list(got) == tokens[:first + 1]
    assert state.digest() == after[first][0]
    streamed = list(spec.sample_tokens(model, PROMPT, STEPS, SAMPLINGS[0],
                                       drafter=spec.ScriptedDrafter(len(PROMPT), tokens), k=7, stops=[stop]))
    assert streamed == tokens[:first + 1]


def test_a_refused_verify_changes_nothing(model, plains):
    tokens = plains[0][0]
    state, token = prefilled(model), PROMPT[-1]
    token = model.step(state, token, SAMPLINGS[0])
    before = (state.digest(), logits_sha(state), int(state.token), state.host_pos)
    model.arm_refusal(1, 0, 7, "moe")
    try:
        with pytest.raises(RefusalError, match="layer 1 site moe"):
            model.verify(state, token, tokens[1:5], SAMPLINGS[0])
    finally:
        model.reset_refusals()
    assert (state.digest(), logits_sha(state), int(state.token), state.host_pos) == before
    with pytest.raises(dsv4.QuarantineError):
        model.verify(state, token, [], SAMPLINGS[0])


def test_bad_verify_input_is_refused_naming_it(model):
    state = prefilled(model, capacity=len(PROMPT) + 2)
    before = state.digest()
    limit = model.cfg.sliding_window - 1
    with pytest.raises(ValueError, match=f"8 drafts; at most {limit}"):
        model.verify(state, 1, [1] * 8)
    with pytest.raises(ValueError, match="outside"):
        model.verify(state, 1, [model.cfg.vocab_size])
    with pytest.raises(CapacityError, match="4 more token"):
        model.verify(state, 1, [1, 2, 3])
    with pytest.raises(TypeError, match="SamplingParams"):
        model.verify(state, 1, [1], sampling={"temperature": 1.0})
    assert state.digest() == before and state.quarantine is None and state.host_pos == len(PROMPT) - 1
    with pytest.raises(ValueError, match="k -1"):
        list(spec.sample_tokens(model, PROMPT, 4, k=-1))


def test_ngram_drafter_proposes_what_followed_the_latest_match():
    d = spec.NgramDrafter(n_max=3, n_min=1)
    assert d.propose([1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 1, 2, 3], 2) == [5, 6]  # the latest 3-gram match
    assert d.propose([7, 8, 1, 2, 9, 9, 4, 2], 3) == [9, 9, 4]  # no 3- or 2-gram: the latest 1-gram
    assert d.propose([1, 2, 3], 4) == [] and d.propose([4], 2) == [] and d.propose([1, 1], 0) == []
    assert spec.NgramDrafter(n_max=2, n_min=2).propose([7, 8, 1, 2, 9, 9, 4, 2], 3) == []
    with pytest.raises(ValueError, match="n_min"):
        spec.NgramDrafter(n_max=1, n_min=2)


@pytest.mark.slow  # 63 s in CI's interpreter (session 52): test_undo's and test_verify_chunk's kernel cases run verify
def test_verify_on_the_kernels_is_the_plain_stream(monkeypatch):  # steps through the kernels in CI, CUDA the GPU file's
    """DSV4_KERNELS=triton (the interpreter on CPU): the decode kernels run each verify row as its decode step."""
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    model = dsv4.load("tiny", device="cpu")
    prompt = PROMPT[:6]
    tokens, after = plain(model, SAMPLINGS[0], steps=9, prompt=prompt)
    state, token = prefilled(model, prompt), prompt[-1]
    got = model.verify(state, token, tokens[:4], SAMPLINGS[0])
    drafts = list(tokens[5:9])
    drafts[2] += 1
    got += model.verify(state, got[-1], drafts, SAMPLINGS[0])
    assert list(got) == tokens[:8]
    assert state.digest() == after[7][0]


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    ckpt = synth(preset("tiny"), tmp_path_factory.mktemp("spec") / "tiny", seed=5, quant="none")
    model = dsv4.load(ckpt, device="cpu", dtype=torch.float32, ranks=2)
    yield model
    model.close()


def test_two_ranks_speculative_stream_is_the_plain_stream(two):
    tokens = list(two.sample_tokens(PROMPT, 16, SAMPLINGS[0]))
    got = list(spec.sample_tokens(two, PROMPT, 16, SAMPLINGS[0],
                                  drafter=Flipper(len(PROMPT), tokens, two.cfg.vocab_size), k=3))
    assert got == tokens
    state, token = prefilled(two), PROMPT[-1]
    got = two.verify(state, token, tokens[:3], SAMPLINGS[0])
    assert list(got) == tokens[:4]
    digests = two.digests_all(state)
    assert len(set(digests)) == 1  # every rank committed the same bytes
    plain_state, token = prefilled(two), PROMPT[-1]
    for _ in range(4):
        token = two.step(plain_state, token, SAMPLINGS[0])
    assert two.digests_all(plain_state) == digests


@pytest.mark.parametrize("mtp", [False, True], ids=["verify", "verify_draft"])
def test_a_verify_step_is_capturable(mtp):
    """Model.verify_device (what a CUDA graph of a verify step would hold) reads nothing back and sizes nothing
    from data (dsv4.syncguard.NoHostSync, on CPU); its readback settles as verify's would."""
    from dsv4.syncguard import NoHostSync

    model = dsv4.load("tiny", device="cpu", mtp=mtp)
    tokens = plain(model, SAMPLINGS[0], steps=4)[0]
    state = prefilled(model)
    with torch.inference_mode(), NoHostSync():
        out = model.verify_device(state, torch.tensor([PROMPT[-1], *tokens[:3]]), SAMPLINGS[0],
                                  torch.tensor([model.cfg.eos_token_id]), k=2 if mtp else 0)
    out = out.tolist()
    assert [int(t) for t in out[:4]] == tokens[:4] and out[4] == 3 and out[5] == 0 and len(out) == (8 if mtp else 6)
