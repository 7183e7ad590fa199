"""Logit processing before the draw (dsv4.sampler.process_logits / sample_processed) and the batched step
with processors (Model.step_batch_processed): each field against a torch reference on hand-made logits,
rows with the defaults bit-identical to the plain sampler, batched rows equal to each row alone, logprobs
normalised and agreeing with the draws, and a batch without processors running the plain step's ops.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import dsv4
from dsv4.engine import Batch
from dsv4.sampler import (TOP_LOGPROBS, LogitsParams, Processing, ProcessRows, SamplingParams, SamplingRows,
                          TokenCounts, process_logits, sample_processed, sample_rows)
from dsv4.syncguard import NoHostSync

V = 40


def rows_of(samplings, processing, top=None):
    rows = SamplingRows(len(samplings), "cpu")
    rows.load(samplings)
    proc = ProcessRows(len(samplings), V, "cpu", top)
    proc.load(processing)
    return rows, proc


def counts_of(generated_lists, prompts):
    gen = torch.zeros(len(generated_lists), V)
    seen = torch.zeros(len(generated_lists), V, dtype=torch.bool)
    for b, (g, p) in enumerate(zip(generated_lists, prompts)):
        for t in g:
            gen[b, t] += 1
        seen[b, list(p)] = True
    return gen, seen


@pytest.fixture
def logits():
    return torch.randn(3, V, generator=torch.Generator().manual_seed(0)) * 3


GEN = [[1, 1, 2, 5], [3, 3, 3], []]
PROMPTS = [(7, 8), (1,), (2, 9)]


def test_presence_and_frequency_are_openais(logits):
    ps = [LogitsParams(presence_penalty=0.5, frequency_penalty=0.25), LogitsParams(presence_penalty=-1.0),
          LogitsParams(frequency_penalty=2.0)]
    rows, proc = rows_of([SamplingParams()] * 3, [Processing(p) for p in ps])
    gen, seen = counts_of(GEN, PROMPTS)
    out = process_logits(logits, rows, proc, gen, seen)
    presence = torch.tensor([p.presence_penalty for p in ps]).unsqueeze(-1)
    frequency = torch.tensor([p.frequency_penalty for p in ps]).unsqueeze(-1)
    want = logits - presence * (gen > 0).float() - frequency * gen
    torch.testing.assert_close(out, want, rtol=0, atol=1e-6)
    assert out[0, 1] == pytest.approx(float(logits[0, 1]) - 0.5 - 0.5)  # count 2


def test_repetition_penalty_is_hfs_over_prompt_and_output(logits):
    rows, proc = rows_of([SamplingParams()] * 3, [Processing(LogitsParams(repetition_penalty=r)) for r in (1.3, 0.8, 2.0)])
    gen, seen = counts_of(GEN, PROMPTS)
    out = process_logits(logits, rows, proc, gen, seen)
    want = logits.clone()
    for b, r in enumerate((1.3, 0.8, 2.0)):
        for t in set(GEN[b]) | set(PROMPTS[b]):  # HF's RepetitionPenaltyLogitsProcessor
            x = want[b, t]
            want[b, t] = x / r if x > 0 else x * r
    torch.testing.assert_close(out, want, rtol=0, atol=1e-6)


def test_min_p_is_vllms_after_temperature(logits):
    samplings = [SamplingParams(temperature=t) for t in (0.5, 1.0, 2.0)]
    rows, proc = rows_of(samplings, [Processing(LogitsParams(min_p=0.1))] * 3)
    gen, seen = counts_of([[], [], []], [(), (), ()])
    out = process_logits(logits, rows, proc, gen, seen)
    for b, s in enumerate(samplings):
        probs = torch.softmax(logits[b] / s.temperature, -1)
        drop = probs < 0.1 * probs.max()
        assert drop.any() and not drop.all()
        assert torch.isinf(out[b][drop]).all() and torch.equal(out[b][~drop], logits[b][~drop])


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.5])
def test_logit_bias_100_forces_the_token(logits, temperature):
    n = 16
    big = logits[:1].expand(n, V)
    rows, proc = rows_of([SamplingParams(temperature=temperature, seed=s) for s in range(n)],
                         [Processing(LogitsParams(logit_bias={11: 100.0}))] * n)
    gen, seen = counts_of([[]] * n, [()] * n)
    token, _ = sample_processed(big, rows, proc, torch.arange(n), gen, seen)
    assert token.tolist() == [11] * n
    plain = sample_rows(big, rows, torch.arange(n))
    assert set(plain.tolist()) != {11}  # the bias did it


def test_mask_allows_only_its_tokens(logits):
    allowed = [4, 17, 33]
    mask = torch.zeros(2, dtype=torch.int32)
    for t in allowed:
        word = mask[t // 32].item() | (1 << (t % 32))
        mask[t // 32] = word - (1 << 32) if word >= 1 << 31 else word
    n = 64
    rows, proc = rows_of([SamplingParams(seed=s) for s in range(n)],
                         [Processing(LogitsParams(), mask=mask)] * n)
    gen, seen = counts_of([[]] * n, [()] * n)
    token, _ = sample_processed(logits[:1].expand(n, V), rows, proc, torch.arange(n), gen, seen)
    assert set(token.tolist()) <= set(allowed) and len(set(token.tolist())) > 1


def test_default_rows_are_the_plain_sampler_bit_for_bit():
    g = torch.Generator().manual_seed(1)
    n = 32
    logits = torch.randn(n, V, generator=g) * 4
    samplings = [SamplingParams(temperature=[0.0, 0.6, 1.0, 1.7][i % 4], top_p=[1.0, 0.9, 0.5][i % 3],
                                top_k=[0, 5][i % 2], seed=i) for i in range(n)]
    rows, proc = rows_of(samplings, [None] * n)
    gen, seen = counts_of([[i % V, 3] for i in range(n)], [(i % V,) for i in range(n)])  # counts: unused at 0
    assert torch.equal(process_logits(logits, rows, proc, gen, seen), logits)
    token, _ = sample_processed(logits, rows, proc, torch.arange(n) + 100, gen, seen)
    assert torch.equal(token, sample_rows(logits, rows, torch.arange(n) + 100))


def test_batched_rows_equal_each_row_alone():
    g = torch.Generator().manual_seed(2)
    n = 6
    logits = torch.randn(n, V, generator=g) * 3
    samplings = [SamplingParams(temperature=t, top_k=k, seed=i) for i, (t, k) in
                 enumerate([(1.0, 0), (0.0, 0), (0.8, 7), (1.2, 0), (0.5, 3), (1.0, 0)])]
    processing = [Processing(LogitsParams(presence_penalty=0.7, logprobs=3)), None,
                  Processing(LogitsParams(repetition_penalty=1.4, min_p=0.05, logprobs=0)),
                  Processing(LogitsParams(logit_bias={2: -5.0, 3: 4.0}, frequency_penalty=0.3)),
                  Processing(LogitsParams(min_p=0.2, logprobs=TOP_LOGPROBS)), Processing(LogitsParams())]
    gen, seen = counts_of([[1, 2, 2], [5], [], [3, 3], [0], [9]], [(1,), (), (4, 5), (), (2,), ()])
    pos = torch.arange(n) * 7
    rows, proc = rows_of(samplings, processing, TOP_LOGPROBS)
    token, (values, ids) = sample_processed(logits, rows, proc, pos, gen, seen)
    for b in range(n):
        r1, p1 = rows_of([samplings[b]], [processing[b]], TOP_LOGPROBS)
        t1, (v1, i1) = sample_processed(logits[b:b + 1], r1, p1, pos[b:b + 1], gen[b:b + 1], seen[b:b + 1])
        assert torch.equal(t1, token[b:b + 1]) and torch.equal(v1, values[b:b + 1]) and torch.equal(i1, ids[b:b + 1])


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 5, 1.0), (0.7, 0, 0.6), (1.3, 8, 0.9)])
def test_logprobs_are_the_distribution_drawn_from(temperature, top_k, top_p):
    """Top logprobs sum to 1 over the kept tokens, the chosen token's is among them, and draws follow them."""
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(3)) * 2
    n = 4000
    s = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=9)
    rows, proc = rows_of([s] * n, [Processing(LogitsParams(presence_penalty=0.4, logprobs=TOP_LOGPROBS))] * n,
                         TOP_LOGPROBS)
    gen, seen = counts_of([[0, 1, 2]] * n, [()] * n)
    token, (values, ids) = sample_processed(logits.expand(n, V), rows, proc, torch.arange(n), gen, seen)
    top = values[0, 1:].exp()
    assert torch.equal(values[:, 1:], values[:1, 1:].expand(n, -1))  # one distribution, every position
    assert float(top.sum()) == pytest.approx(1.0, abs=1e-5)
    assert top.tolist() == sorted(top.tolist(), reverse=True)  # most likely first
    lookup = dict(zip(ids[0].tolist(), values[0, 1:].tolist()))
    for t, v in zip(token.tolist(), values[:, 0].tolist()):
        assert v == pytest.approx(lookup[t], abs=1e-6)
    freq = torch.bincount(token, minlength=V).float() / n
    for t, p in zip(ids[0].tolist(), top.tolist()):
        assert abs(float(freq[t]) - p) < 4 * math.sqrt(p * (1 - p) / n) + 1e-3, (t, float(freq[t]), p)
    # against a torch reference: presence, temperature, top-k / top-p, renormalised
    x = logits[0] - 0.4 * (torch.arange(V) < 3).float()
    p = torch.softmax(x / temperature, -1)
    sp, order = torch.sort(p, descending=True, stable=True)
    keep = torch.ones(V, dtype=torch.bool)
    if top_p < 1:
        keep &= (torch.cumsum(sp, 0) - sp) < top_p
    if top_k:
        keep &= torch.arange(V) < top_k
    want = torch.where(keep, sp / sp[keep].sum(), 0.0)[:TOP_LOGPROBS].log()
    torch.testing.assert_close(values[0, 1:], want, rtol=0, atol=1e-5)
    assert ids[0].tolist() == order[:TOP_LOGPROBS].tolist()


def test_params_are_checked():
    for bad in ({"repetition_penalty": 0}, {"min_p": 1.5}, {"logprobs": 21}, {"logit_bias": {-1: 1.0}},
                {"presence_penalty": math.inf}):
        with pytest.raises(ValueError):
            LogitsParams(**bad)
    assert LogitsParams(logit_bias={5: 1, 2: 3}).logit_bias == ((2, 3.0), (5, 1.0))
    assert not LogitsParams(logprobs=2).processes and LogitsParams(min_p=0.1).processes


# ---- the batched step with processors, on the tiny model -------------------------------------------------

PROMPT_IDS = [[5, 6, 7], [9, 10, 11, 12], [3, 4], [40, 41, 42]]
STEPS = 6


@pytest.fixture(scope="module")
def model():
    return dsv4.load("tiny", device="cpu")


def prefilled(model, i):
    state = model.new_state(64)
    model.prefill(state, PROMPT_IDS[i][:-1])
    return state


SAMPLE = [SamplingParams(temperature=1.0, seed=1), SamplingParams(temperature=0.0),
          SamplingParams(temperature=0.8, top_k=20, seed=3), SamplingParams(temperature=1.1, top_p=0.9, seed=4)]
PROC = [LogitsParams(presence_penalty=1.5, frequency_penalty=0.5, logprobs=2), None,
        LogitsParams(repetition_penalty=1.8, min_p=0.05), LogitsParams(logit_bias={7: 3.0}, logprobs=5)]


def run_rows(model, rows, steps=STEPS):
    states = [prefilled(model, i) for i in rows]
    tokens = [PROMPT_IDS[i][-1] for i in rows]
    out = {i: [] for i in rows}
    for step in range(steps):
        processing = [None if PROC[i] is None else
                      Processing(PROC[i], prompt=tuple(PROMPT_IDS[i]) if step == 0 else None) for i in rows]
        drawn = model.step_batch_processed(states, tokens, [SAMPLE[i] for i in rows], processing)
        tokens = [d.token for d in drawn]
        for i, d in zip(rows, drawn):
            out[i].append(d)
    return out, states


def test_engine_batched_processed_rows_equal_each_alone(model):
    together, states = run_rows(model, [0, 1, 2, 3])
    for i in range(4):
        alone, _ = run_rows(model, [i])
        assert alone[i] == together[i], f"row {i}"
    assert len(together[3][0].top) == 5 and len(together[0][0].top) == 2 and together[1][0].logprob is None
    counts = model._counts[states[0]].generated
    assert counts.tolist() == torch.bincount(torch.tensor([d.token for d in together[0]]),
                                             minlength=model.cfg.vocab_size).float().tolist()


def test_engine_penalties_change_the_tokens(model):
    """A huge presence penalty: no token repeats (the counts are updated inside the step)."""
    states, token = [prefilled(model, 0)], [PROMPT_IDS[0][-1]]
    seen = []
    for _ in range(12):
        (d,) = model.step_batch_processed(states, token, [SamplingParams(temperature=0.0)],
                                          [Processing(LogitsParams(presence_penalty=1e4))])
        token = [d.token]
        seen.append(d.token)
    assert len(set(seen)) == len(seen)


def test_engine_logit_bias_forces_the_token(model):
    states = [prefilled(model, i) for i in range(3)]
    tokens = [PROMPT_IDS[i][-1] for i in range(3)]
    for _ in range(3):
        drawn = model.step_batch_processed(states, tokens, SAMPLE[:3],
                                           [Processing(LogitsParams(logit_bias={77: 100.0}))] * 3)
        tokens = [d.token for d in drawn]
        assert tokens == [77, 77, 77]


def test_without_processors_the_step_is_the_plain_one(model):
    """No row needs processing: the same tokens as step_batch and the same device ops as the plain step."""
    a = [prefilled(model, i) for i in range(3)]
    b = [prefilled(model, i) for i in range(3)]
    ta = tb = [PROMPT_IDS[i][-1] for i in range(3)]
    for _ in range(3):
        ta = list(model.step_batch(a, ta, SAMPLE[:3]))
        tb = [d.token for d in model.step_batch_processed(b, tb, SAMPLE[:3], [None, Processing(LogitsParams()), None])]
        assert ta == tb
    assert model._new_batch(b, None).process is None

    def plain_step(batch):  # step_batch_device as it is without processors (the hold and the feed, then the draw)
        held = model.hold.clone()
        active = batch.active & ~held
        tokens = torch.where(batch.feed, torch.stack([s.token for s in batch.states]), batch.input)
        verdict = model.transformer.transaction(batch.states, tokens, active)
        model.hold.logical_or_(verdict != 0)
        status = torch.where(verdict != 0, verdict.double(), -held.double()).view(1)
        logits = torch.stack([s.logits for s in batch.states])
        pos = torch.stack([s.pos for s in batch.states])
        drawn = sample_rows(logits, batch.rows, pos)
        for i, s in enumerate(batch.states):
            s.token.copy_(torch.where(active[i], drawn[i], s.token))
        return torch.cat([drawn.double(), status])

    def ops(step, states):
        batch = Batch(states, "cpu")
        batch.input.copy_(torch.tensor(ta))
        batch.active.fill_(True)
        batch.rows.load(SAMPLE[:3])
        with torch.inference_mode(), _Ops() as seen:
            step(batch)
        return seen.names

    assert ops(model.step_batch_device, a) == ops(plain_step, b)


class _Ops(TorchDispatchMode):
    def __enter__(self):
        self.names = []
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_processed_step_makes_no_host_sync(model):
    states = [prefilled(model, i) for i in range(2)]
    batch = model._new_batch(states, "logprobs")
    batch.input.copy_(torch.tensor([7, 12]))
    batch.active.fill_(True)
    batch.rows.load(SAMPLE[:2])
    batch.process.load([Processing(PROC[0]), Processing(LogitsParams(min_p=0.1, logit_bias={3: 2.0}))])
    with torch.inference_mode(), NoHostSync():
        model.step_batch_device(batch)


def test_token_counts_reset_from_the_prompt():
    c = TokenCounts(V, "cpu")
    c.generated[3] = 2
    c.reset((4, 4, 9))
    assert c.generated.sum() == 0 and c.prompt.nonzero().flatten().tolist() == [4, 9]


def test_two_ranks_processed_rows_agree_and_equal_each_alone(tmp_path_factory):
    """Over 2 ranks (gloo) every rank draws the same tokens and logprobs (the driver checks it: "agree"), and a
    batch's rows equal each row alone on the same 2 ranks."""
    from dsv4.checkpoint.synth import synth
    from dsv4.config import preset

    ckpt = synth(preset("tiny"), tmp_path_factory.mktemp("proc") / "tiny", seed=5, quant="none")
    two = dsv4.load(ckpt, device="cpu", dtype=torch.float32, ranks=2)
    try:
        together, _ = run_rows(two, [0, 2, 3], steps=4)
        for i in (0, 2, 3):
            assert run_rows(two, [i], steps=4)[0][i] == together[i], f"row {i}"
    finally:
        two.close()
