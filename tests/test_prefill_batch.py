"""Several prompts' short prefill chunks in one forward (Model.prefill_batch; issue 12).

The contract is the batched decode step's: a state's chunk prefilled among others leaves its every committed
byte, its hidden row, its logits and its position equal to the same chunk prefilled alone
(`prefill(state, chunk, chunk_size=T)`), and the tokens sampled after it are equal too, for states at
different positions (chunks crossing sliding-window wraps and compress closes), plain or slots of one pool.
A short chunk (dsv4.model.rows.short_chunk) runs every row alone whatever the batch, so this is bit-identity,
not a tolerance. A refused forward commits nothing for any state. On CPU the torch reference runs; on CUDA
(DSV4_KERNELS=triton) the same tests run the kernels, with tiny's dense weights and with FP8/FP4 ones.
"""

from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4 import RefusalError, SamplingParams
from dsv4.kernels import moe as fused_moe
from dsv4.layout import CONFIG as layout_config
from dsv4.model import rows as rows_mod
from dsv4.model.rows import short_chunk
from dsv4.state import StatePool
from dsv4.syncguard import NoHostSync

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CAPACITY = 48
# Prefixes of 3, 10 and 17 tokens (tiny: sliding window 8, compress rates 4 and 16), then a chunk of T.
PREFIXES = [3, 10, 17]
SAMPLINGS = [SamplingParams(temperature=1.0, seed=3), SamplingParams(temperature=0.0),
             SamplingParams(temperature=0.8, top_k=5, seed=9)]
STEPS = 3


def prompt(i: int, n: int) -> list[int]:
    return [(37 * i + 11 * j) % 500 + 2 for j in range(n)]


def quantised_model():
    """tiny with FP8 attention/shared weights and FP4 experts (written_config "fp8"): the GEMV and pair kernels."""
    from dsv4.checkpoint.init import random_weights
    from dsv4.checkpoint.synth import written_config
    from dsv4.engine import Model
    from dsv4.model.forward import Transformer
    from dsv4.parallel import Comm

    cfg = written_config(dsv4.config.preset("tiny"), "fp8")
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    weights = random_weights(cfg, device=DEVICE, dtype=dtype, seed=3)
    return Model(cfg, Transformer(cfg, weights, Comm(cfg.num_hidden_layers, DEVICE), DEVICE, dtype))


@pytest.fixture(scope="module", params=["dense", "fp8"])
def model(request):
    return dsv4.load("tiny", device=DEVICE) if request.param == "dense" else quantised_model()


def prefixed(model, state, i):
    model.prefill(state, prompt(i, PREFIXES[i]))
    return state


def after(model, state, i, T):
    """What a state holds after its chunk, then the tokens (and digests) of STEPS sampled steps."""
    got = (state.digest(), state.logits.clone(), state.host_pos)
    token, steps = prompt(i, PREFIXES[i] + T + 1)[-1], []
    for _ in range(STEPS):
        token = model.step(state, token, SAMPLINGS[i])
        steps.append((token, state.digest()))
    return got, steps


def solo(model, i, T):
    state = prefixed(model, model.new_state(CAPACITY), i)
    logits = model.prefill(state, prompt(i, PREFIXES[i] + T)[PREFIXES[i]:], chunk_size=T)
    assert torch.equal(logits, state.logits)
    return after(model, state, i, T)


# DSV4_PREFILL_GEMV: the process's GEMVs ("") and the tensor-core tiles for a chunk's rows (v3; CUDA: on CPU the
# torch reference runs either way)
PREFILL_GEMVS = ["", "v3"] if DEVICE == "cuda" else [""]


@pytest.mark.parametrize("prefill_gemv", PREFILL_GEMVS)
@pytest.mark.parametrize("pooled", [False, True])
@pytest.mark.parametrize("T", [6, 12])  # 12: past the decode attention kernel's MAX_T (the prefill kernel)
def test_prefill_batch_equals_each_chunk_alone(model, T, pooled, prefill_gemv, monkeypatch):
    monkeypatch.setitem(layout_config, "prefill_gemv", prefill_gemv)
    rows = [2, 0, 1]
    if pooled:  # the server's states: slots of one pool, not in slot order
        pool = StatePool(model.cfg, 4, CAPACITY, model.device, model.dtype)
        states = [prefixed(model, pool.state(s), i) for s, i in zip((3, 0, 2), rows)]
    else:
        states = [prefixed(model, model.new_state(CAPACITY), i) for i in rows]
    assert short_chunk(T)
    logits = model.prefill_batch(states, [prompt(i, PREFIXES[i] + T)[PREFIXES[i]:] for i in rows])
    for b, i in enumerate(rows):
        alone = solo(model, i, T)
        assert torch.equal(logits[b], alone[0][1]), f"sequence {i}: returned logits differ from alone"
        got = after(model, states[b], i, T)
        assert got[0][0] == alone[0][0], f"sequence {i}: committed bytes or hidden differ from alone"
        assert torch.equal(got[0][1], alone[0][1]) and got[0][2] == alone[0][2], f"sequence {i}: logits or pos"
        assert got[1] == alone[1], f"sequence {i}: the sampled continuation differs from alone"


def test_refused_prefill_batch_commits_nothing_for_any(model):
    states = [prefixed(model, model.new_state(CAPACITY), i) for i in range(3)]
    before = [(s.digest(), s.logits.clone(), s.host_pos) for s in states]
    model.arm_refusal(1, 0, 7, "moe")
    try:
        with pytest.raises(RefusalError, match="layer 1 site moe"):
            model.prefill_batch(states, [prompt(i, 5) for i in range(3)])
    finally:
        model.reset_refusals()
    for s, (digest, logits, pos) in zip(states, before):
        assert s.digest() == digest and torch.equal(s.logits, logits) and s.host_pos == pos
        with pytest.raises(dsv4.QuarantineError):
            model.prefill(s, [1, 2])


def test_bad_prefill_batches_are_refused_naming_what(model, monkeypatch):
    a, b = model.new_state(8), model.new_state(8)
    with pytest.raises(ValueError, match="2 states and 1 chunks"):
        model.prefill_batch([a, b], [[1, 2]])
    with pytest.raises(ValueError, match="appears twice"):
        model.prefill_batch([a, a], [[1, 2], [3, 4]])
    with pytest.raises(ValueError, match=r"chunks of \[2, 3\] tokens"):
        model.prefill_batch([a, b], [[1, 2], [3, 4, 5]])
    with pytest.raises(dsv4.CapacityError):
        model.prefill_batch([a, b], [[1] * 9, [2] * 9])
    monkeypatch.setitem(fused_moe.CONFIG, "prefill_pair_tokens", 2)
    with pytest.raises(ValueError, match="at most 2 each"):
        model.prefill_batch([a, b], [[1, 2, 3], [4, 5, 6]])
    assert a.host_pos == 0 and b.host_pos == 0 and a.digest() == model.new_state(8).digest()
    model.prefill_batch([a], [[1, 2, 3]])  # one state: any length (that is prefill)
    assert a.host_pos == 3


def test_prefill_batch_forward_makes_no_host_sync(model):
    states = [prefixed(model, model.new_state(CAPACITY), i) for i in range(3)]
    tokens = torch.tensor([t for i in range(3) for t in prompt(i, 6)], device=model.device)
    with torch.inference_mode(), NoHostSync():
        model.transformer.transaction(states, tokens)


def test_two_ranks_prefill_batch_equals_alone():
    """On two ranks (gloo) too: each state's bytes on every rank, and its continuation, equal alone."""
    if DEVICE != "cpu":
        pytest.skip("the gloo ranks run on CPU")
    two = dsv4.load("tiny", device="cpu", dtype=torch.float32, ranks=2)
    try:
        rows, T = [0, 2], 6
        expect = {i: solo(two, i, T) for i in rows}
        states = [prefixed(two, two.new_state(CAPACITY), i) for i in rows]
        two.prefill_batch(states, [prompt(i, PREFIXES[i] + T)[PREFIXES[i]:] for i in rows])
        for b, i in enumerate(rows):
            ranks = two.digests_all(states[b])
            assert len(set(ranks)) == 1, f"sequence {i}: the ranks' states differ"
            got = after(two, states[b], i, T)
            assert (got[0][0], got[0][2], got[1]) == (expect[i][0][0], expect[i][0][2], expect[i][1]), f"sequence {i}"
            assert torch.equal(got[0][1], expect[i][0][1])
    finally:
        two.close()


def test_step_gemv_follows_the_step_kind(monkeypatch):
    """prefill_gemv applies to a short prefill chunk's rows (rows alone, T > 1) only: never to a decode step (T 1),
    a long chunk (not rows alone) or outside a forward; unset, every step takes the process's GEMVs."""
    monkeypatch.setitem(layout_config, "prefill_gemv", "v3")
    with rows_mod.rows_alone(True, 12):
        assert rows_mod.step_gemv() == "v3"
    for on, T in ((True, 1), (False, 300)):
        with rows_mod.rows_alone(on, T):
            assert rows_mod.step_gemv() is None
    assert rows_mod.step_gemv() is None
    monkeypatch.setitem(layout_config, "prefill_gemv", "")
    with rows_mod.rows_alone(True, 12):
        assert rows_mod.step_gemv() is None


@pytest.mark.skipif(DEVICE != "cuda", reason="the GEMV kernels run on CUDA (CPU: the torch reference)")
@torch.inference_mode()
def test_prefill_gemv_v3_runs_the_chunk_on_the_tensor_cores(monkeypatch):
    """DSV4_PREFILL_GEMV=v3 on tiny's FP8 weights: a 12-token chunk's FP8 linears launch v3 (the decode steps after
    it v2), and its logits stay within 2 % (bf16) of the chunk prefilled on v2, as the decode steps after it do."""
    from dsv4.kernels import qgemv

    model = quantised_model()
    kinds = []
    launch3, launch2 = qgemv._launch3, qgemv._launch2
    monkeypatch.setattr(qgemv, "_launch3", lambda *a, **k: kinds.append("v3") or launch3(*a, **k))
    monkeypatch.setattr(qgemv, "_launch2", lambda *a, **k: kinds.append("v2") or launch2(*a, **k))
    out = {}
    for gemv in ("", "v3"):
        monkeypatch.setitem(layout_config, "prefill_gemv", gemv)
        state = model.new_state(CAPACITY)
        kinds.clear()
        out[gemv] = [model.prefill(state, prompt(0, 12), chunk_size=12).float()]
        prefill_kinds = set(kinds)
        kinds.clear()
        out[gemv].append(model.decode(state, 7).float())
        assert set(kinds) == {"v2"}, gemv  # a decode step: the process's (v2)
        assert prefill_kinds == ({"v2"} if gemv == "" else {"v3"}), (gemv, prefill_kinds)
    for a, b in zip(out[""], out["v3"]):
        assert float((a - b).abs().max() / a.abs().max()) <= 0.02
