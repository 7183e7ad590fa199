"""Speculative decoding on CUDA (GPU only; skipped on CPU): Model.verify's rows are model.step's decode steps, bit
for bit, with the decode kernels and PDL as they run by default (tests/test_speculative.py proves it on CPU).

`mini` (Flash widths) random weights on one GPU, sampled (temperature 1): verify steps whose drafts are the plain
stream (every one accepted, windows and rings crossed) and drafts with every third one wrong, against eager
model.step from the same prompt: the tokens, every committed byte (DecodeState.digest) and the stored logits.
First GPU run: session 48 (H200); verify no longer asks for DSV4_SPECULATIVE=1 on CUDA (the server still does).
"""

from __future__ import annotations

import hashlib
import os

import pytest
import torch

import dsv4
from dsv4 import speculative as spec

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PRESET = os.environ.get("DSV4_GPU_PRESET", "mini")
SAMPLING = dsv4.SamplingParams(temperature=1.0, seed=20261204)
STEPS = 40


@pytest.fixture(scope="module")
def model():
    return dsv4.load(PRESET, device="cuda", seed=0)


@pytest.fixture(scope="module")
def prompt(model):
    g = torch.Generator().manual_seed(5)
    return torch.randint(2, model.cfg.vocab_size, (40,), generator=g).tolist()


def prefilled(model, prompt):
    state = model.new_state(len(prompt) + STEPS + 8)
    model.prefill(state, prompt[:-1])
    return state


def after(state) -> tuple:
    return state.digest(), hashlib.sha256(state.logits.cpu().numpy().tobytes()).hexdigest(), int(state.token)


@pytest.fixture(scope="module")
def plain(model, prompt):
    state, token, tokens, states = prefilled(model, prompt), prompt[-1], [], []
    for _ in range(STEPS):
        token = model.step(state, token, SAMPLING)
        tokens.append(token)
        states.append(after(state))
    return tokens, states


@pytest.mark.parametrize("k", [1, 3, 7])
def test_verify_rows_are_decode_steps_on_cuda(model, prompt, plain, k):
    tokens, states = plain
    state, token, done = prefilled(model, prompt), prompt[-1], 0
    while done + k + 1 <= STEPS:
        got = model.verify(state, token, tokens[done:done + k], SAMPLING)
        assert list(got) == tokens[done:done + k + 1]
        done += k + 1
        assert after(state) == states[done - 1], f"after {done} tokens"
        token = got[-1]


def test_rejections_on_cuda_keep_the_plain_stream(model, prompt, plain):
    tokens, states = plain
    vocab = model.cfg.vocab_size
    drafter = spec.ScriptedDrafter(len(prompt), [(t + (i % 3 == 2)) % vocab for i, t in enumerate(tokens)])
    tally = spec.Tally()
    got = list(spec.sample_tokens(model, prompt, STEPS, SAMPLING, drafter=drafter, k=4, tally=tally))
    assert got == tokens and 0 < tally.acceptance < 1


@pytest.mark.parametrize("fused", [False, True], ids=["torch_undo", "fused_undo"])
@pytest.mark.parametrize("k", [1, 3])
def test_verify_graph_is_the_eager_verify(model, prompt, plain, k, fused, monkeypatch):
    """graph=True (replay.VerifyReplay, captured at the first step of k drafts): the same tokens and bytes as the
    decode steps, with drafts right and wrong; the writes by torch's ops, or by kernels/undo.py in the warm-up and
    the capture (CONFIG fused and capture: its tables filled after the capture and kept with the graph; session 48
    call 4's replays faulted when they were let go)."""
    from dsv4.kernels import undo as fused_undo

    monkeypatch.setitem(fused_undo.CONFIG, "fused", fused)
    monkeypatch.setitem(fused_undo.CONFIG, "capture", fused)
    tokens, states = plain
    state, token, done = prefilled(model, prompt), prompt[-1], 0
    while done + k + 1 <= STEPS:
        drafts = list(tokens[done:done + k])
        if (done // (k + 1)) % 2:
            drafts[-1] = (drafts[-1] + 1) % model.cfg.vocab_size
        got = model.verify(state, token, drafts, SAMPLING, graph=True)
        assert list(got) == tokens[done:done + len(got)]
        done += len(got)
        assert after(state) == states[done - 1], f"after {done} tokens"
        token = got[-1]
    assert model._verify_graphs[state][(k + 1, 0, False, ())].captures == 1  # one graph: rows, drafts, unrestricted


@pytest.fixture(scope="module")
def mtp_model():
    return dsv4.load(PRESET, device="cuda", seed=0, mtp=True)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_mtp_drafted_stream_on_cuda(mtp_model, prompt, graph):
    plain = list(mtp_model.sample_tokens(prompt, 24, SAMPLING))
    tally = spec.Tally()
    got = list(spec.sample_tokens(mtp_model, prompt, 24, SAMPLING, drafter=spec.MtpDrafter(), k=2, tally=tally,
                                  graph=graph))
    assert got == plain and tally.proposed > 0


@pytest.mark.parametrize("pad", [False, True], ids=["short_eager", "padded_graph"])
def test_ngram_stream_on_cuda(model, prompt, plain, pad, monkeypatch):
    """The n-gram drafter with graphs: its short proposals run eagerly, or (speculative CONFIG pad) padded to k so the
    verify graph replays; the stream is the plain one either way."""
    monkeypatch.setitem(spec.CONFIG, "pad", pad)
    tally = spec.Tally()
    got = list(spec.sample_tokens(model, prompt, 24, SAMPLING, drafter=spec.NgramDrafter(), k=3, tally=tally,
                                  graph=True))
    assert got == list(model.sample_tokens(prompt, 24, SAMPLING))
    if pad:
        assert tally.proposed >= 3 * (tally.steps - 3)
