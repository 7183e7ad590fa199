"""The Gumbel-max draw (dsv4.sampler CONFIG method "gumbel", DSV4_SAMPLER=gumbel; opt-in), on CPU.

Checked: its tokens follow the kept distribution (chi-square over many positions, with temperature, top-k and top-p);
a row's token is the same alone and among other rows; the G table is the float64 value of -log(-log u) rounded once;
two close distributions drawn at the same (seed, position) agree at the closed form's rate
(benchmarks/coupling_acceptance.gumbel_agreement), far above the inverse draw's at a flat distribution; a speculative
stream with the MTP layer is still the plain one, bit for bit; an unknown method is refused at import.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

import dsv4
from dsv4 import sampler
from dsv4.sampler import SamplingParams, sample
from benchmarks.coupling_acceptance import agreement, gumbel_agreement


@pytest.fixture
def gumbel(monkeypatch):
    monkeypatch.setitem(sampler.CONFIG, "method", "gumbel")


def kept_distribution(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """The distribution the draw must follow: softmax(logits / T) over the top-k / top-p kept tokens, renormalised."""
    p = torch.softmax(logits.double() / sp.temperature, 0)
    order = torch.argsort(p, descending=True, stable=True)
    before = torch.cumsum(p[order], 0) - p[order]
    keep = before < sp.top_p
    if sp.top_k:
        keep &= torch.arange(p.numel()) < sp.top_k
    mask = torch.zeros_like(keep).scatter_(0, order, keep)
    q = torch.where(mask, p, 0.0)
    return q / q.sum()


@pytest.mark.parametrize("sp", [SamplingParams(seed=3), SamplingParams(temperature=0.7, seed=4),
                                SamplingParams(top_k=10, seed=5), SamplingParams(top_p=0.8, temperature=1.3, seed=6)])
def test_draws_follow_the_kept_distribution(gumbel, sp):
    V, n = 40, 40_000
    logits = torch.randn(V, generator=torch.Generator().manual_seed(1)) * 2
    q = kept_distribution(logits, sp)
    drawn = sample(logits.expand(n, V), sp, torch.arange(n))
    freq = torch.bincount(drawn, minlength=V).double()
    assert bool((freq[q == 0] == 0).all())  # never a token top-k / top-p dropped
    live = q > 0
    chi2 = float(((freq[live] - n * q[live]) ** 2 / (n * q[live])).sum())
    dof = int(live.sum()) - 1
    assert chi2 < dof + 5 * math.sqrt(2 * dof), (chi2, dof)  # ~5 sigma: a wrong sampler lands far above


def test_a_row_draws_the_same_alone_and_among_others(gumbel):
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(5, 300, generator=g) * 3
    params = [SamplingParams(seed=1), SamplingParams(temperature=0.5, seed=2), SamplingParams.greedy(),
              SamplingParams(top_k=7, seed=4), SamplingParams(top_p=0.6, seed=5)]
    rows = sampler.SamplingRows(5, "cpu", restricted=True)
    rows.load(params)
    pos = torch.tensor([9, 10, 11, 12, 13])
    together = sampler.sample_rows(logits, rows, pos)
    alone = torch.stack([sample(logits[b], params[b], int(pos[b])) for b in range(5)])
    assert torch.equal(together, alone)
    assert int(together[2]) == int(logits[2].argmax())  # a greedy row: its argmax


def test_the_table_is_one_rounding_of_the_float64_value():
    table = sampler.gumbel_table("cpu")
    assert table.shape == (1 << 24,) and table.dtype == torch.float32
    for k in (0, 1, 12345, 1 << 23, (1 << 24) - 1):
        u = (k + 0.5) * 2.0**-24
        assert float(table[k]) == float(torch.tensor(-math.log(-math.log(u)), dtype=torch.float32))


def test_close_distributions_agree_at_the_closed_forms_rate(monkeypatch):
    """A model's logits and a drafter's (the same plus noise), each drawn at the same (seed, position): the share
    of equal tokens is gumbel_agreement's under the Gumbel draw, and the quantile coupling's (far lower at this flat
    distribution) under the inverse draw."""
    V, n = 2000, 4000
    g = torch.Generator().manual_seed(3)
    a = torch.randn(V, generator=g, dtype=torch.float64) * 0.5
    b = a + torch.randn(V, generator=g, dtype=torch.float64) * 0.1
    p, q = torch.softmax(a, 0), torch.softmax(b, 0)
    pos, sp = torch.arange(n), SamplingParams(seed=9)
    rates = {}
    for method in ("gumbel", "inverse"):
        monkeypatch.setitem(sampler.CONFIG, "method", method)
        same = sample(a.float().expand(n, V), sp, pos) == sample(b.float().expand(n, V), sp, pos)
        rates[method] = float(same.double().mean())
    assert abs(rates["gumbel"] - gumbel_agreement(p, q)) < 0.02
    assert abs(rates["inverse"] - agreement(p, q)) < 0.03
    assert rates["gumbel"] > 0.9 and rates["gumbel"] - rates["inverse"] > 0.3, rates


def test_speculating_with_the_mtp_layer_keeps_the_plain_stream(gumbel):
    from dsv4 import speculative

    model = dsv4.load("tiny", device="cpu", dtype=torch.float32, mtp=True)
    ids = [5, 9, 3, 7] * 5
    streams = []
    for sp in (SamplingParams(temperature=1.0, seed=1), SamplingParams(temperature=0.8, top_p=0.9, seed=2)):
        plain = list(model.sample_tokens(ids, 24, sp))
        got = list(speculative.sample_tokens(model, ids, 24, sp, speculative.MtpDrafter(), 3))
        assert got == plain
        streams.append(plain)
    sampler.CONFIG["method"] = "inverse"
    assert list(model.sample_tokens(ids, 24, SamplingParams(temperature=1.0, seed=1))) != streams[0]  # another stream


def test_an_unknown_method_is_refused_at_import():
    r = subprocess.run([sys.executable, "-c", "import dsv4"], capture_output=True, text=True, timeout=120,
                       env={"DSV4_SAMPLER": "bogus", "PATH": "/usr/bin:/bin"})
    assert r.returncode != 0 and "DSV4_SAMPLER='bogus'" in r.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_draws_equal_host_draws(gumbel):
    """On a GPU the Gumbel draw of the same logits is the host's, token for token (the shared table)."""
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(64, 129280, generator=g) * 3
    pos = torch.arange(64) * 7
    for sp in (SamplingParams(seed=1), SamplingParams(temperature=0.6, top_p=0.9, seed=2)):
        host = sample(logits, sp, pos)
        device = sample(logits.cuda(), sp, pos.cuda())
        assert torch.equal(host, device.cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_is_the_reference_bit_for_bit(gumbel, monkeypatch, dtype):
    """dsv4.kernels.gumbel (interpreted on CPU, compiled on a GPU) draws the reference's tokens exactly: every row
    kind (sampled, greedy, a kept set), several chunks a row, any batch."""
    pytest.importorskip("triton")
    from dsv4 import kernels
    from dsv4.kernels import gumbel as kernel

    if not (kernels.interpreting() or torch.cuda.is_available()):
        pytest.skip("the kernel runs interpreted (TRITON_INTERPRET=1) or on a GPU")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        monkeypatch.setattr(kernel, "CHUNK", 64)  # several chunks a row, at the interpreter's pace
    g = torch.Generator().manual_seed(5)
    V = 300 if device == "cpu" else 129280
    logits = (torch.randn(6, V, generator=g) * 3).to(dtype)
    logits[3, 17] = logits[3, 250] = logits[3].max() + 1  # a tie: the lowest id
    params = [SamplingParams(seed=1), SamplingParams(temperature=0.5, seed=2), SamplingParams.greedy(),
              SamplingParams.greedy(), SamplingParams(top_k=7, seed=4), SamplingParams(top_p=0.6, seed=5)]
    rows = sampler.SamplingRows(6, device)
    rows.load(params)
    pos = torch.tensor([9, 10, 11, 12, 13, 14], device=device)
    kept = sampler._kept_mask(sampler._kept_set(logits.to(device), rows))
    got = kernel.token(logits.to(device), rows.temperature, rows.key, pos, kept, sampler.gumbel_table(device))
    want = sampler._token_gumbel(logits.to(device), rows.temperature, rows.key, pos, kept)
    assert torch.equal(got.cpu(), want.cpu()) and int(got[3]) == 17
    alone = kernel.token(logits[1:2].to(device), rows.temperature[1:2], rows.key[1:2], pos[1:2], None,
                         sampler.gumbel_table(device))
    assert int(alone[0]) == int(sampler._token_gumbel(logits[1:2].to(device), rows.temperature[1:2], rows.key[1:2],
                                                      pos[1:2], None)[0])
