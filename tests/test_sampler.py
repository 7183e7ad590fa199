"""Tests for dsv4.sampler: the counter-based draw and temperature / top-k / top-p sampling."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dsv4.sampler import GREEDY, SamplingParams, SamplingRows, sample, sample_rows, uniform

try:
    from scipy import stats
except ImportError:  # scipy is a test extra; fall back to hand-rolled statistics
    stats = None

SEEDS = [0, 1, 20260907, 2**63 + 5, 2**64 - 1]
N_POS = 4096


def _chisquare_p(observed: np.ndarray, expected: np.ndarray) -> float:
    """p-value of Pearson's chi-square goodness of fit (scipy, or Wilson-Hilferty if absent)."""
    if stats is not None:
        return float(stats.chisquare(observed, expected).pvalue)
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    k = len(observed) - 1
    z = ((chi2 / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


# ---------------------------------------------------------------------------
# uniform


@pytest.mark.parametrize("seed", SEEDS)
def test_uniform_host_and_tensor_agree_bit_for_bit(seed):
    pos = torch.arange(N_POS, dtype=torch.int64)
    dev = uniform(seed, pos)
    assert dev.dtype == torch.float32 and dev.shape == pos.shape
    host = torch.tensor([uniform(seed, p) for p in range(N_POS)], dtype=torch.float64)
    # The host floats are 24-bit values, so float64 -> float32 is exact; compare bits.
    assert torch.equal(dev.view(torch.int32), host.float().view(torch.int32))
    assert torch.equal(dev.double(), host)


def test_uniform_tensor_any_shape_and_large_pos():
    pos = torch.tensor([[0, 1, 2**31], [2**40 + 3, 2**62, 2**63 - 1]], dtype=torch.int64)
    out = uniform(7, pos)
    assert out.shape == (2, 3)
    for idx in np.ndindex(2, 3):
        assert out[idx].item() == uniform(7, int(pos[idx]))
    assert uniform(7, torch.tensor(5)).shape == ()
    assert uniform(7, torch.tensor([5], dtype=torch.int32)).item() == uniform(7, 5)


def test_uniform_range_and_uniformity():
    pos = torch.arange(N_POS, dtype=torch.int64)
    u = torch.cat([uniform(s, pos) for s in SEEDS]).double().numpy()
    assert (u >= 0).all() and (u < 1).all()
    # 24-bit values: u * 2**24 is an integer.
    assert np.array_equal(u * 2**24, np.floor(u * 2**24))
    assert abs(u.mean() - 0.5) < 0.01
    counts = np.histogram(u, bins=64, range=(0, 1))[0]
    assert _chisquare_p(counts, np.full(64, len(u) / 64)) > 1e-3
    if stats is not None:
        assert stats.kstest(u, "uniform").pvalue > 1e-3


def test_uniform_streams_uncorrelated():
    pos = torch.arange(N_POS, dtype=torch.int64)
    a = uniform(0, pos).double().numpy()
    # Neighbouring seeds and neighbouring positions must not track each other.
    for other in (uniform(1, pos).double().numpy(), np.roll(a, 1)):
        assert abs(np.corrcoef(a, other)[0, 1]) < 0.05
    assert not np.array_equal(a, uniform(1, pos).double().numpy())


def test_uniform_rejects_bad_args():
    for bad in (-1, 2**64, True, 1.0):
        with pytest.raises(ValueError, match="seed"):
            uniform(bad, 0)
    for bad in (-1, 2**63, 1.5):
        with pytest.raises(ValueError, match="pos"):
            uniform(0, bad)
    with pytest.raises(TypeError):
        uniform(0, torch.tensor([0.5]))


# ---------------------------------------------------------------------------
# sample: distribution

# 12 tokens, with ties (ids 2/5 and 8/9) and a spread wide enough that top-k / top-p bite.
LOGITS = np.array([0.3, -1.0, 1.2, 0.0, 2.0, 1.2, -0.5, 0.8, 0.1, 0.1, -2.0, 1.6])


def _expected(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    """The target distribution, computed independently in float64."""
    x = logits / p.temperature
    probs = np.exp(x - x.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    keep = np.ones(len(probs), dtype=bool)
    if p.top_k:
        keep[p.top_k :] = False
    if p.top_p < 1:
        before = np.concatenate([[0.0], np.cumsum(probs[order])[:-1]])
        # The fp32 sampler and this float64 reference must not disagree on the cut.
        assert np.abs(before - p.top_p).min() > 1e-4
        keep &= before < p.top_p
    out = np.zeros_like(probs)
    out[order[keep]] = probs[order[keep]]
    return out / out.sum()


COMBOS = [
    SamplingParams(temperature=1.0, seed=11),
    SamplingParams(temperature=0.7, top_k=5, seed=12),
    SamplingParams(temperature=1.3, top_p=0.8, seed=13),
    SamplingParams(temperature=1.0, top_k=4, top_p=0.6, seed=2**64 - 2),
    SamplingParams(temperature=2.5, top_k=100, top_p=0.95, seed=15),
    SamplingParams(temperature=0.4, top_p=0.9, seed=16),
    SamplingParams(temperature=1.0, top_k=7, seed=17),  # cuts the 8/9 tie: only 8 survives
]


@pytest.mark.parametrize("params", COMBOS, ids=repr)
def test_sample_frequencies_match_distribution(params):
    n = 20000
    tokens = sample(torch.tensor(LOGITS, dtype=torch.float32), params, torch.arange(n))
    assert tokens.shape == (n,) and tokens.dtype == torch.int64
    counts = np.bincount(tokens.numpy(), minlength=len(LOGITS))
    expected = _expected(LOGITS, params)
    assert counts[expected == 0].sum() == 0, "a token outside top-k / top-p was sampled"
    support = expected > 0
    assert support.sum() >= 3, "pick params that keep several tokens"
    assert _chisquare_p(counts[support], n * expected[support]) > 1e-3


def test_sample_int_pos_matches_tensor_pos():
    logits = torch.tensor(LOGITS, dtype=torch.float32)
    for params in COMBOS[:3]:
        batched = sample(logits, params, torch.arange(300))
        one_by_one = [sample(logits, params, p) for p in range(300)]
        assert all(t.shape == () and t.dtype == torch.int64 for t in one_by_one)
        assert torch.equal(torch.stack(one_by_one), batched)
        assert torch.equal(torch.stack([sample(logits, params, torch.tensor(p)) for p in range(50)]), batched[:50])


def test_sample_batched_logits():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 40, generator=gen)
    params = SamplingParams(temperature=0.9, top_k=10, top_p=0.9, seed=3)
    pos = torch.arange(100, 106)
    batched = sample(logits, params, pos)
    assert batched.shape == (6,)
    rows = torch.stack([sample(logits[i], params, int(pos[i])) for i in range(6)])
    assert torch.equal(batched, rows)
    assert sample(logits, params, 100).shape == (6,)
    assert sample(logits, GREEDY, pos).shape == (6,)


def test_sample_zero_probability_tail_never_drawn():
    # Tokens whose softmax underflows to 0 must not be picked even with top_p = 1, top_k = 0.
    logits = torch.tensor([0.0, -200.0, 0.5, -300.0])
    tokens = sample(logits, SamplingParams(seed=9), torch.arange(5000))
    assert set(tokens.tolist()) <= {0, 2}


# ---------------------------------------------------------------------------
# sample: determinism, greedy, ties


def test_same_seed_same_stream_different_seed_different_stream():
    logits = torch.tensor(LOGITS, dtype=torch.float32)
    pos = torch.arange(2000)
    a = sample(logits, SamplingParams(seed=1), pos)
    assert torch.equal(a, sample(logits, SamplingParams(seed=1), pos))
    b = sample(logits, SamplingParams(seed=2), pos)
    assert (a != b).float().mean() > 0.5


def test_greedy_is_argmax_ties_to_lowest_id():
    logits = torch.tensor([0.1, 3.0, -1.0, 5.0, 2.0, 5.0, 5.0])
    assert sample(logits, GREEDY, 0).item() == 3
    assert sample(logits, SamplingParams.greedy(), torch.tensor(17)).item() == 3
    assert sample(logits.to(torch.bfloat16), GREEDY, 0).item() == 3
    assert torch.equal(sample(logits, GREEDY, torch.arange(4)), torch.full((4,), 3))
    batch = torch.tensor([[1.0, 1.0, 0.0], [0.0, 2.0, 2.0], [7.0, 7.0, 7.0]])
    assert sample(batch, GREEDY, 0).tolist() == [0, 1, 0]


def test_stable_sort_and_top_k_1_ties_to_lowest_id():
    logits = torch.tensor([0.0, 4.0, 1.0, 4.0, 4.0, -2.0])
    _, order = torch.sort(torch.softmax(logits, -1), descending=True, stable=True)
    assert order[:3].tolist() == [1, 3, 4]
    for params in (
        SamplingParams(temperature=1.0, top_k=1, seed=5),
        SamplingParams(temperature=3.0, top_p=0.01, seed=6),
    ):
        assert torch.equal(sample(logits, params, torch.arange(500)), torch.full((500,), 1))
    # top_k=2 over a three-way tie keeps ids 1 and 3, each about half the time.
    tokens = sample(logits, SamplingParams(top_k=2, seed=7), torch.arange(4000))
    counts = np.bincount(tokens.numpy(), minlength=6)
    assert counts[[0, 2, 4, 5]].sum() == 0 and abs(counts[1] - 2000) < 200


# ---------------------------------------------------------------------------
# SamplingParams validation


@pytest.mark.parametrize(
    "field, bad",
    [
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("temperature", "1"),
        ("temperature", True),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_p", float("nan")),
        ("top_p", None),
        ("top_k", -1),
        ("top_k", 2.0),
        ("top_k", False),
        ("seed", -1),
        ("seed", 2**64),
        ("seed", True),
        ("seed", 1.0),
    ],
)
def test_params_validation_names_field(field, bad):
    with pytest.raises(ValueError, match=field) as err:
        SamplingParams(**{field: bad})
    assert repr(bad) in str(err.value)


def test_params_defaults_and_greedy():
    p = SamplingParams()
    assert (p.temperature, p.top_p, p.top_k, p.seed) == (1.0, 1.0, 0, 0)
    assert SamplingParams.greedy().temperature == 0 and GREEDY.is_greedy
    assert SamplingParams(temperature=1, top_p=1, seed=2**64 - 1) == SamplingParams(seed=2**64 - 1)
    assert SamplingParams(top_k=np.int64(3)).top_k == 3
    with pytest.raises(AttributeError):
        p.seed = 1  # frozen


# ---------------------------------------------------------------------------
# GPU: the device path must reproduce the CPU one


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    pos = torch.arange(N_POS, dtype=torch.int64)
    for seed in SEEDS:
        cpu = uniform(seed, pos)
        gpu = uniform(seed, pos.cuda())
        assert gpu.device.type == "cuda"
        assert torch.equal(gpu.cpu().view(torch.int32), cpu.view(torch.int32))
    logits = torch.tensor(LOGITS, dtype=torch.float32)
    for params in [GREEDY, *COMBOS]:
        cpu = sample(logits, params, pos)
        assert torch.equal(sample(logits.cuda(), params, pos.cuda()).cpu(), cpu)
        assert sample(logits.cuda(), params, 123).item() == cpu[123].item()
    # The whole sampler is capturable in a CUDA graph (no sync, static shapes).
    x, p = logits.cuda(), torch.tensor(0, device="cuda")
    params = COMBOS[3]
    sample(x, params, p)  # warm up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sample(x, params, p)
    for i in (0, 5, 77):
        p.fill_(i)
        graph.replay()
        assert out.item() == sample(logits, params, i).item()


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows", [2, 4, 32])
def test_scan_of_a_row_in_a_batch_equals_the_row_alone(device, rows):
    """The draw's CDF (dsv4.sampler._cumsum) over Flash's vocab: a row scanned among `rows` rows has the
    bits of the same row scanned alone ([1, V] and [V]). On CUDA torch.cumsum's kernel and its float
    association follow the tensor's row count, so a batched row once drew another token than alone
    (the mini gate at 256/256 --batch 4, session 4)."""
    from dsv4.sampler import _cumsum

    gen = torch.Generator().manual_seed(rows)
    probs = torch.softmax(torch.randn(rows, 129280, generator=gen) * 4, dim=-1).to(device)
    batched = _cumsum(probs)
    for b in range(rows):
        alone = _cumsum(probs[b:b + 1])[0]
        assert torch.equal(batched[b], alone), f"row {b} of {rows} on {device}"
        assert torch.equal(_cumsum(probs[b]), alone)
    # and it is a cumsum: within fp32 rounding of float64's
    exact = probs.double().cumsum(-1)
    assert (batched.double() - exact).abs().max().item() < 1e-5


# ---------------------------------------------------------------------------
# Rows without top_k / top_p skip the kept-set sort: the same tokens


def test_rows_without_top_k_top_p_draw_the_same_token_with_or_without_the_sort():
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(4, 300, generator=gen)
    plain = [SamplingParams(seed=1), SamplingParams(temperature=0.6, seed=2), GREEDY, SamplingParams(seed=4)]
    pos = torch.arange(4) + 50
    restricted, unrestricted = SamplingRows(4, "cpu"), SamplingRows(4, "cpu", restricted=False)
    restricted.load(plain)
    unrestricted.load(plain)
    assert torch.equal(sample_rows(logits, restricted, pos), sample_rows(logits, unrestricted, pos))
    # and beside a row that does restrict, each plain row keeps its token
    restricted.load(plain[:3] + [SamplingParams(top_p=0.5, seed=4)])
    assert torch.equal(sample_rows(logits, restricted, pos)[:3], sample_rows(logits, unrestricted, pos)[:3])


def test_unrestricted_rows_refuse_top_k_and_top_p():
    rows = SamplingRows(2, "cpu", restricted=False)
    for wide in (SamplingParams(top_k=5), SamplingParams(top_p=0.9)):
        with pytest.raises(ValueError, match="top_k / top_p"):
            rows.load([SamplingParams(), wide])
    rows.load([SamplingParams(temperature=0.0, top_k=5, top_p=0.5), SamplingParams()])  # greedy: they change nothing
    with pytest.raises(ValueError, match="top_k / top_p"):
        SamplingRows(1, "cpu", SamplingParams(top_p=0.5), restricted=False)


def test_reference_rows_alone_equal_rows_batched():
    """The torch path computes each row alone: a row's token among 37 rows (a vocabulary of two chunks and a tail,
    no multiple of a SIMD width) is its token alone, whatever sits beside it."""
    from dsv4.kernels import sample as sample_kernel

    gen = torch.Generator().manual_seed(8)
    vocab = sample_kernel.CHUNK + 37
    logits = torch.randn(37, vocab, generator=gen) * 4
    rows = SamplingRows(37, "cpu", restricted=False)
    rows.load([SamplingParams(temperature=0.5 + (b % 5) / 4, seed=b) for b in range(37)])
    pos = torch.arange(37) * 3
    together = sample_rows(logits, rows, pos)
    for b in (0, 17, 36):
        alone = SamplingRows(1, "cpu", restricted=False)
        alone.load([SamplingParams(temperature=0.5 + (b % 5) / 4, seed=b)])
        assert torch.equal(sample_rows(logits[b:b + 1], alone, pos[b:b + 1]), together[b:b + 1])


def test_sample_with_rows_built_before():
    """sample with SamplingRows built once (a captured step's, filled before its capture) draws what sample builds
    itself, position after position; rows for another shape or another restriction are refused, naming both."""
    g = torch.Generator().manual_seed(5)
    for params in (SamplingParams(temperature=0.8, seed=9), SamplingParams(temperature=1.0, top_k=5, seed=2), GREEDY):
        restricted = not params.is_greedy and (params.top_k > 0 or params.top_p < 1)
        rows = SamplingRows(1, "cpu", params, restricted=restricted)
        for pos in range(6):
            logits = torch.randn(64, generator=g)
            p = torch.tensor(pos)
            assert int(sample(logits, params, p, rows)) == int(sample(logits, params, p))
    with pytest.raises(ValueError, match="2 rows"):
        sample(torch.zeros(64), GREEDY, torch.tensor(0), SamplingRows(2, "cpu", GREEDY, restricted=False))
    with pytest.raises(ValueError, match="restricted=False"):
        sample(torch.zeros(64), SamplingParams(top_k=3, seed=1), torch.tensor(0),
               SamplingRows(1, "cpu", GREEDY, restricted=False))
