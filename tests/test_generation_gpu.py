"""generate's decode loop on CUDA (dsv4.generation.pipelined_tokens: the one-row batch graph, one step in flight)
samples model.step's stream bit for bit, and leaves nothing behind (GPU only; skipped on CPU).

`mini` (Flash widths) random weights on one GPU, sampled (temperature 1): sample_tokens against eager model.step
from the same prompt; an early stop (an EOS) settles the step in flight; the loop's graph is dropped when it ends.
"""

from __future__ import annotations

import os

import pytest
import torch

import dsv4

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PRESET = os.environ.get("DSV4_GPU_PRESET", "mini")
SAMPLING = dsv4.SamplingParams(temperature=1.0, seed=20261202)
STEPS = 48


@pytest.fixture(scope="module")
def model():
    return dsv4.load(PRESET, device="cuda", seed=0)


@pytest.fixture(scope="module")
def prompt(model):
    g = torch.Generator().manual_seed(3)
    return torch.randint(2, model.cfg.vocab_size, (40,), generator=g).tolist()


def eager_stream(model, prompt, steps):
    state = model.new_state(len(prompt) + steps)
    model.prefill(state, prompt[:-1])
    token, out = prompt[-1], []
    for _ in range(steps):
        token = model.step(state, token, SAMPLING)
        out.append(token)
    return out, state.digest()


def test_sample_tokens_graph_pipelined_equals_eager_step(model, prompt):
    expect, _ = eager_stream(model, prompt, STEPS)
    assert list(model.sample_tokens(prompt, STEPS, SAMPLING)) == expect
    assert model.batch_captures() == 0 and not model._pending  # the loop's graph dropped, nothing in flight


def test_pipelined_tokens_state_and_early_stop(model, prompt):
    from dsv4.generation import pipelined_tokens

    expect, digest = eager_stream(model, prompt, 12)
    state = model.new_state(len(prompt) + 12)
    model.prefill(state, prompt[:-1])
    assert list(pipelined_tokens(model, state, prompt[-1], 12, SAMPLING)) == expect
    assert state.digest() == digest and state.host_pos == len(prompt) - 1 + 12
    state = model.new_state(len(prompt) + 12)
    model.prefill(state, prompt[:-1])
    loop = pipelined_tokens(model, state, prompt[-1], 12, SAMPLING)
    assert [next(loop) for _ in range(5)] == expect[:5]
    loop.close()  # the step in flight (the 6th) settled: the state one step past the last token read
    assert state.host_pos == len(prompt) - 1 + 6 and not model._pending and model.batch_captures() == 0
    assert model.step(state, expect[5], SAMPLING) == expect[6]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_ranks_pipelined_graph_equals_step(prompt):
    """The pipelined one-row batch graph over 2 ranks (not yet what sample_tokens takes there: generation.py keeps the
    step loop over several ranks until this passes on two GPUs) samples model.step's stream."""
    from dsv4.generation import pipelined_tokens

    two = dsv4.load(PRESET, device="cuda", ranks=2, seed=0)
    try:
        expect, digest = eager_stream(two, prompt, 16)
        state = two.new_state(len(prompt) + 16)
        two.prefill(state, prompt[:-1])
        assert list(pipelined_tokens(two, state, prompt[-1], 16, SAMPLING)) == expect
        assert state.digest() == digest
    finally:
        two.close()
