"""dsv4.kernels.hc_head against the reference (dsv4.model.hc's torch ops): fp32 streams at tiny's width and bf16
at 2,048 (two 1,024-wide blocks) within the stated tolerance (the norm applied after the projection: another
summation order), each row alone equal to it in a batch of five, bit for bit; and the switch: off by default on
CUDA until its GPU run."""

from __future__ import annotations

import pytest
import torch

from dsv4 import kernels
from dsv4.config import preset
from dsv4.kernels import hc_head as fused_head
from dsv4.model import hc

DEVICES = (["cpu"] if kernels.interpreting() else []) + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.skipif(not DEVICES, reason="the kernel needs Triton's interpreter or a GPU")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,D", [(torch.float32, 64), (torch.bfloat16, 2048)], ids=["fp32-tiny", "bf16-two_blocks"])
def test_against_the_reference(monkeypatch, device, dtype, D):
    cfg = preset("tiny").replace(hidden_size=D)
    g = torch.Generator().manual_seed(D)
    hcm = cfg.hc_mult
    h = (torch.randn(5, hcm, D, generator=g) * 3).to(dtype).to(device)
    fn = (torch.randn(hcm, hcm * D, generator=g) / (hcm * D) ** 0.5).to(device)
    base, scale = torch.randn(hcm, generator=g).to(device), torch.rand(1, generator=g).to(device)
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    ref = hc.hc_head(h, fn, base, scale, cfg)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    got = hc.hc_head(h, fn, base, scale, cfg)
    assert got.dtype == dtype and got.shape == (5, D)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2 ** -7, atol=2 ** -7)
    torch.testing.assert_close(got.float(), ref.float(), **tol)
    for r in range(5):
        assert torch.equal(hc.hc_head(h[r:r + 1], fn, base, scale, cfg), got[r:r + 1]), r


def test_on_by_default_and_its_switch(monkeypatch):
    import os

    assert fused_head.GPU_CHECKED == (os.environ.get("DSV4_HC_HEAD", "1") == "1")
    t = torch.zeros(1, 4, 8)
    assert fused_head.supported(t, 4) and not fused_head.supported(t, 3)
    assert not fused_head.supported(torch.zeros(4, 8), 4)


@pytest.mark.skipif(not DEVICES, reason="the kernel needs Triton's interpreter or a GPU")
@pytest.mark.parametrize("device", DEVICES)
def test_wide_mix_keeps_the_bits(monkeypatch, device):
    """CONFIG wide_mix (DSV4_HC_HEAD_WIDE: the mix's GEMV reads the bf16 streams and widens them as it loads them)
    gives the head collapse the bits of the fp32 copy's GEMV, at 2,048 and at Flash's 4,096, one row and five."""
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    for D in (2048, 4096):
        cfg = preset("tiny").replace(hidden_size=D)
        g = torch.Generator().manual_seed(D + 1)
        hcm = cfg.hc_mult
        h = (torch.randn(5, hcm, D, generator=g) * 3).to(torch.bfloat16).to(device)
        fn = (torch.randn(hcm, hcm * D, generator=g) / (hcm * D) ** 0.5).to(device)
        base, scale = torch.randn(hcm, generator=g).to(device), torch.rand(1, generator=g).to(device)
        for rows in (slice(0, 1), slice(None)):
            monkeypatch.setitem(fused_head.CONFIG, "wide_mix", False)
            copied = hc.hc_head(h[rows], fn, base, scale, cfg)
            monkeypatch.setitem(fused_head.CONFIG, "wide_mix", True)
            assert torch.equal(hc.hc_head(h[rows], fn, base, scale, cfg), copied), (D, rows)
