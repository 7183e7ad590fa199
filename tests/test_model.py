"""The forward and DecodeState on CPU: chunked prefill, capacity, determinism, digests."""

from __future__ import annotations

import io
import sys

import pytest
import torch

import dsv4
from dsv4.state import CapacityError

TOL = 1e-4  # fp32; prefill chunks and single steps differ only in summation order


@pytest.fixture(scope="module")
def model():
    return dsv4.load("tiny", device="cpu", dtype=torch.float32, seed=3)


def ids(n, seed=0, vocab=512):
    return torch.randint(2, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


@torch.inference_mode()
def test_prefill_then_decode_equals_decode_from_start(model):
    stream = ids(90)
    N = 37  # not a window boundary of any kind (window 8, CSA 4, HCA 16)
    ref_state = model.new_state(100)
    ref = [model.decode(ref_state, t) for t in stream]
    for chunk in (1, 3, 4, 16, 37, 64):
        state = model.new_state(100)
        logits = model.prefill(state, stream[:N], chunk_size=chunk)
        assert rel(logits, ref[N - 1]) <= TOL, f"chunk {chunk}: prefill logits"
        for j, t in enumerate(stream[N:]):
            assert rel(model.decode(state, t), ref[N + j]) <= TOL, f"chunk {chunk}: decode step {j}"
        assert state.host_pos == int(state.pos) == len(stream)


@torch.inference_mode()
def test_same_bytes_same_digests_and_restore(model):
    a, b = model.new_state(64), model.new_state(64)
    model.prefill(a, ids(20, 1))
    model.prefill(b, ids(20, 1))
    assert a.digest() == b.digest()
    c = model.new_state(64)
    c.restore(a)
    assert c.digest() == a.digest() and c.host_pos == 20
    model.decode(a, 5)
    assert a.digest() != c.digest()
    assert torch.equal(model.decode(c, 5), a.logits)
    assert a.digest() == c.digest()


@torch.inference_mode()
def test_capacity_errors_write_nothing(model):
    state = model.new_state(10)
    model.prefill(state, ids(8))
    before = state.digest()
    with pytest.raises(CapacityError, match="capacity of 10"):
        model.prefill(state, ids(3))
    assert state.digest() == before and state.host_pos == 8
    model.decode(state, 3)
    model.decode(state, 4)
    with pytest.raises(CapacityError, match="exceed"):
        model.decode(state, 5)
    with pytest.raises(CapacityError):
        model.step(state, 5)
    assert int(state.pos) == 10


@torch.inference_mode()
def test_bad_tokens_are_named(model):
    state = model.new_state(10)
    with pytest.raises(ValueError, match=r"outside \[0, vocab_size=512\)"):
        model.prefill(state, [1, 2, 512])
    with pytest.raises(ValueError, match="no tokens"):
        model.prefill(state, [])
    with pytest.raises(ValueError, match="outside"):
        model.decode(state, -1)
    assert state.host_pos == 0 and int(state.pos) == 0


def test_decode_never_reads_device_values_on_host(model, monkeypatch):
    """The step itself has no .item()/.tolist() (the readback after it is the only sync)."""
    state = model.new_state(16)
    calls = []
    real_item = torch.Tensor.item

    def spy(self):
        calls.append(1)
        return real_item(self)

    monkeypatch.setattr(torch.Tensor, "item", spy)
    with torch.inference_mode():
        model.transformer.transaction([state], torch.tensor([3]))
    assert calls == []


def test_random_init_is_finite_and_deterministic():
    a = dsv4.load("tiny", device="cpu", seed=11)
    b = dsv4.load("tiny", device="cpu", seed=11)
    sa, sb = a.new_state(40), b.new_state(40)
    la, lb = a.prefill(sa, ids(40, 2)), b.prefill(sb, ids(40, 2))
    assert torch.isfinite(la).all() and la.abs().max() > 0
    assert torch.equal(la, lb)


def test_bf16_runs_finite():
    m = dsv4.load("tiny", device="cpu", dtype=torch.bfloat16, seed=1)
    s = m.new_state(64)
    logits = m.prefill(s, ids(60, 4), chunk_size=16)
    assert torch.isfinite(logits).all()


def test_replay_needs_cuda_and_says_so(model):
    from dsv4.replay import ReplayError

    state = model.new_state(8)
    with pytest.raises(ReplayError, match="needs a CUDA state"):
        model.enable_replay(state)
    assert state.replay is None and model.captures(state) == 0


@torch.inference_mode()
def test_prefill_continues_a_sequence_at_any_position(model):
    """A chunk may start anywhere: inside a sliding window, a CSA window and an HCA window."""
    stream = ids(60, 5)
    ref_state = model.new_state(64)
    ref = [model.decode(ref_state, t) for t in stream]
    state = model.new_state(64)
    for t in stream[:5]:
        model.decode(state, t)
    model.prefill(state, stream[5:27], chunk_size=7)  # chunks start at 5, 12, 19, 26
    assert rel(state.logits, ref[26]) <= TOL
    model.prefill(state, stream[27:50], chunk_size=50)  # one chunk spanning an HCA close (48)
    assert rel(state.logits, ref[49]) <= TOL
    for j, t in enumerate(stream[50:]):
        assert rel(model.decode(state, t), ref[50 + j]) <= TOL, f"decode after prefill, step {j}"


def test_two_refusals_in_one_step_record_the_last_door():
    """Two armed cells fire in the same step: the step is refused, both codes are consumed, and the
    rank's word and where are the last door's in door order (layer, then attention before moe)."""
    from dsv4.engine import RefusalError

    model = dsv4.load("tiny", device="cpu", dtype=torch.float32)
    L = model.cfg.num_hidden_layers
    state = model.new_state(16)
    model.prefill(state, [1, 2, 3])
    model.arm_refusal(L - 1, 0, 71, "attention")
    model.arm_refusal(1, 0, 72, "moe")
    with pytest.raises(RefusalError, match=f"rank 0 layer {L - 1} site attention word 71"):
        model.step(state, 4, dsv4.SamplingParams(seed=1))
    assert model.refusal_words() == [71]
    assert int(model.comm.armed.abs().sum()) == 0  # one shot: both consumed
    assert model.comm.fired.tolist() == [71, L - 1, 0]
    model.reset_refusals()
    state.discard()


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_prefill_progress_bar_keeps_the_chunks_bits(model, monkeypatch):
    """dsv4.generation.prefill: with progress on a terminal, a bar over the prompt's tokens, and the state
    byte for byte what one model.prefill with the same chunks leaves; off a terminal, no bar."""
    from dsv4 import generation

    ids = list(range(3, 40))
    plain = model.new_state(64)
    model.prefill(plain, ids, chunk_size=8)
    err = _Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    shown = model.new_state(64)
    generation.prefill(model, shown, ids, progress=True, chunk_size=8)
    assert "prefill" in err.getvalue() and f"/{len(ids)} [" in err.getvalue()
    assert shown.digest() == plain.digest() and torch.equal(shown.logits, plain.logits)
    quiet = io.StringIO()
    monkeypatch.setattr(sys, "stderr", quiet)
    generation.prefill(model, model.new_state(64), ids, progress=True, chunk_size=8)
    assert quiet.getvalue() == ""
