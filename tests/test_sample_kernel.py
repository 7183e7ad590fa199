"""dsv4.kernels.sample (the sampler's token in two launches) against its torch reference, dsv4.sampler._token_reference,
and against the definition it implements: the kept tokens' CDF inverted in vocabulary order at u x their total.

Kernel and reference compute the same weights by different exp and sum implementations (float32, a few ulps apart),
so a token may differ only where the target lies within that rounding of a CDF boundary: each draw is checked
against the float64 CDF (the target inside the drawn token's interval, widened by 1e-5 of the total), and the tokens
must equal the reference's wherever the target is further than that from every boundary."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dsv4 import kernels, sampler
from dsv4.kernels import sample

pytest.importorskip("triton")

# CPU tensors run the kernel through Triton's interpreter (CPU machines), CUDA tensors compiled (GPU machines).
DEVICES = (["cpu"] if kernels.interpreting() else []) + (["cuda"] if torch.cuda.is_available() else [])
SLACK = 1e-5


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """The interpreter runs a program per chunk in Python: chunks of 64 keep several chunks per row (the
    multi-chunk paths) at a fraction of the time. The CUDA runs keep the real CHUNK."""
    if not torch.cuda.is_available():
        monkeypatch.setattr(sample, "CHUNK", 64)


def _rows(temperatures, seeds, device):
    rows = sampler.SamplingRows(len(seeds), device)
    rows.load([sampler.SamplingParams(temperature=t, seed=s) for t, s in zip(temperatures, seeds)])
    return rows


def _check(logits, rows, pos, kept, got):
    """Each token against the float64 definition, and equal to the reference away from the boundaries."""
    ref = sampler._token_reference(logits.cpu(), rows.temperature.cpu(), rows.key.cpu(), pos.cpu(),
                                   None if kept is None else kept.cpu())
    x = logits.cpu().double()
    t = rows.temperature.cpu().double()
    u = sampler._uniform_keyed(rows.key.cpu(), pos.cpu()).double()
    for b in range(x.shape[0]):
        if t[b] == 0:
            assert got[b] == ref[b] == int(torch.argmax(logits[b].cpu()))
            continue
        w = torch.exp(x[b] / t[b] - (x[b] / t[b]).max())
        if kept is not None:
            w = torch.where(kept[b].cpu(), w, 0.0)
        cdf = torch.cumsum(w, 0) / w.sum()
        token = int(got[b])
        assert w[token] > 0, f"row {b}: drew token {token} of zero weight"
        low = float(cdf[token - 1]) if token else 0.0
        assert low - SLACK <= u[b] <= float(cdf[token]) + SLACK, f"row {b}: u {float(u[b])} outside token {token}"
        if float(torch.min(torch.abs(cdf - u[b]))) > SLACK:
            assert token == int(ref[b]), f"row {b}: kernel {token}, reference {int(ref[b])}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chunks", [1, 3])
def test_token_matches_the_definition_and_the_reference(device, chunks):
    vocab = 50 if chunks == 1 else 2 * sample.CHUNK + 23  # one chunk; two and a tail
    g = torch.Generator().manual_seed(vocab)
    B = 6
    logits = (torch.randn(B, vocab, generator=g) * 3).to(device)
    logits[1, ::7] = -float("inf")  # masked tokens: zero weight, never drawn
    rows = _rows([1.0, 0.7, 0.0, 1.3, 1.0, 2.0], [1, 2, 3, 4, 5, 2**64 - 1], device)
    for step in range(4):
        pos = torch.arange(B, device=device) * 1000 + step
        got = sample.token(logits, rows.temperature, rows.key, pos, None).cpu()
        _check(logits, rows, pos, None, got)
        kept = torch.rand(B, vocab, generator=g).to(device) < 0.3
        kept[:, 0] = True
        got = sample.token(logits, rows.temperature, rows.key, pos, kept).cpu()
        _check(logits, rows, pos, kept, got)


@pytest.mark.parametrize("device", DEVICES)
def test_a_row_alone_equals_it_among_others_and_all_kept_equals_no_set(device):
    g = torch.Generator().manual_seed(3)
    vocab = sample.CHUNK + 77
    logits = torch.randn(5, vocab, generator=g).to(device)
    rows = _rows([1.0, 0.5, 1.0, 0.0, 1.5], [7, 8, 9, 10, 11], device)
    pos = torch.tensor([3, 1, 4, 1, 5], device=device)
    together = sample.token(logits, rows.temperature, rows.key, pos, None)
    everything = torch.ones(5, vocab, dtype=torch.bool, device=device)
    assert torch.equal(sample.token(logits, rows.temperature, rows.key, pos, everything), together)
    for b in range(5):
        alone = sample.token(logits[b:b + 1].contiguous(), rows.temperature[b:b + 1], rows.key[b:b + 1],
                             pos[b:b + 1], None)
        assert torch.equal(alone, together[b:b + 1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_kept_set_of_every_token_leaves_the_sums_bit_equal(device, dtype):
    """Kernel 1's chunk maxima and weight sums with a kept set of every token equal those without a set, bit for bit
    (a row's sums must not depend on whether another row of its step keeps a subset: the kept set's width once set
    their summation order on the GPU). 64 rows of Flash's vocabulary on CUDA."""
    vocab = 129280 if device == "cuda" else 2 * sample.CHUNK + 5
    rows = 64 if device == "cuda" else 2
    logits = (torch.randn(rows, vocab, generator=torch.Generator().manual_seed(14)) * 4).to(dtype).to(device)
    temperature = torch.full((rows,), 0.8, device=device)
    every = torch.ones(rows, vocab, dtype=torch.bool, device=device)
    none_ws, none_top = sample.chunk_sums(logits, temperature, None)
    all_ws, all_top = sample.chunk_sums(logits, temperature, every)
    assert torch.equal(all_ws, none_ws) and torch.equal(all_top, none_top)


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_takes_the_lowest_id_among_maxima_across_chunks(device):
    vocab = 3 * sample.CHUNK
    logits = torch.zeros(2, vocab)
    logits[0, [sample.CHUNK + 5, 5 + 2 * sample.CHUNK]] = 4.0  # tied in chunks 1 and 2
    logits[1, [9, sample.CHUNK]] = 4.0
    rows = _rows([0.0, 0.0], [1, 2], device)
    got = sample.token(logits.to(device), rows.temperature, rows.key, torch.zeros(2, dtype=torch.int64, device=device),
                       None)
    assert got.tolist() == [sample.CHUNK + 5, 9]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (4,000 rows: minutes in the interpreter, whose "
                    "draws test_token_matches_the_definition_and_the_reference checks one by one)")
def test_frequencies_across_chunks_match_the_softmax():
    """Eight live tokens spread over three chunks (the chunks' scales exp(m_c - m) at work): 4,000 draws."""
    device = "cuda"
    vocab = 2 * sample.CHUNK + 500
    live = torch.tensor([3, 100, sample.CHUNK - 1, sample.CHUNK, sample.CHUNK + 9, 2 * sample.CHUNK,
                         2 * sample.CHUNK + 400, 2 * sample.CHUNK + 499])
    values = torch.tensor([0.0, 1.0, -1.0, 2.0, 0.5, -0.5, 1.5, 0.2])
    n = 4000
    logits = torch.full((n, vocab), -float("inf"))
    logits[:, live] = values
    rows = sampler.SamplingRows(n, device, sampler.SamplingParams(seed=21))
    got = sample.token(logits.to(device), rows.temperature, rows.key, torch.arange(n, device=device), None).cpu()
    assert set(got.tolist()) <= set(live.tolist())
    counts = np.array([(got == t).sum().item() for t in live])
    expected = n * torch.softmax(values.double(), 0).numpy()
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 24.3, (counts, expected)  # 7 degrees of freedom: p = 0.001


def test_the_sampler_takes_the_kernel_under_triton(monkeypatch):
    """sample_rows with DSV4_KERNELS=triton draws what the torch path draws (away from boundaries: these logits'
    CDF steps are wide), restricted rows (top_k / top_p: the kept set) included."""
    device = DEVICES[0]
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(4, 300, generator=g).to(device)
    rows = sampler.SamplingRows(4, device)
    rows.load([sampler.SamplingParams(temperature=0.9, top_p=0.8, seed=1), sampler.SamplingParams(top_k=5, seed=2),
               sampler.SamplingParams(seed=3), sampler.SamplingParams.greedy()])
    pos = torch.tensor([4, 9, 1000, 2], device=device)
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    ref = sampler.sample_rows(logits, rows, pos)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    assert torch.equal(sampler.sample_rows(logits, rows, pos), ref)


@pytest.mark.parametrize("device", DEVICES)
def test_nan_rows_draw_ids_inside_the_vocabulary(device):
    """A padding row's logits may be garbage: its token (discarded by the step) must still be an id the embedding
    holds, greedy or sampled."""
    vocab = 2 * sample.CHUNK + 5
    logits = torch.full((2, vocab), float("nan"))
    rows = _rows([0.0, 1.0], [1, 2], device)
    got = sample.token(logits.to(device), rows.temperature, rows.key, torch.zeros(2, dtype=torch.int64, device=device),
                       None)
    assert ((got >= 0) & (got < vocab)).all(), got
