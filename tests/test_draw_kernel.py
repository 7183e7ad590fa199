"""dsv4.kernels.draw (the sampler's draw in one launch) against its torch reference, sampler._uniform_keyed, and
the Python draw: equal bits (integer arithmetic; tolerance 0)."""

from __future__ import annotations

import pytest
import torch

from dsv4 import kernels, sampler
from dsv4.kernels import draw

pytest.importorskip("triton")

# CPU tensors run the kernel through Triton's interpreter (CPU machines), CUDA tensors compiled (GPU machines).
DEVICES = (["cpu"] if kernels.interpreting() else []) + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_draw_kernel_bits(device):
    g = torch.Generator().manual_seed(5)
    seeds = [0, 1, 2**63, 2**64 - 1] + torch.randint(0, 2**62, (196,), generator=g).tolist()
    key = torch.tensor([sampler._signed(sampler._key(s)) for s in seeds], dtype=torch.int64)
    pos = torch.cat([torch.tensor([0, 1, 2**40, 2**62]), torch.randint(0, 2**31, (196,), generator=g)])
    got = draw.uniform(key.to(device), pos.to(device)).cpu()
    assert torch.equal(got, sampler._uniform_keyed(key, pos))
    assert got.tolist()[:8] == [sampler.uniform(s, int(p)) for s, p in zip(seeds[:8], pos[:8].tolist())]


@pytest.mark.parametrize("device", DEVICES)
def test_sampler_takes_the_kernel_under_triton(monkeypatch, device):
    """sample_rows with DSV4_KERNELS=triton (the kernel) draws the tokens of the torch draw."""
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(3, 50, generator=g).to(device)
    rows = sampler.SamplingRows(3, device)
    rows.load([sampler.SamplingParams(temperature=0.9, top_p=0.8, seed=s) for s in (1, 2, 3)])
    pos = torch.tensor([4, 9, 1000], device=device)
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    ref = sampler.sample_rows(logits, rows, pos)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    assert torch.equal(sampler.sample_rows(logits, rows, pos), ref)
