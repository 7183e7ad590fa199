"""dsv4.kernels.rope_table against the reference (Rope.cos_sin's torch ops): on CUDA bit for bit (the kernel calls
the CUDA math library's cosf / sinf, as torch's cos and sin do); under Triton's interpreter (numpy's cos and sin)
within 2 ulp of fp32. Positions up to Flash's context (1M), both kinds of table in one launch, the step's lazily
kept tables."""

from __future__ import annotations

import pytest
import torch

from dsv4 import kernels
from dsv4.config import preset
from dsv4.kernels import rope_table
from dsv4.model.rope import Rope

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def reference(rope: Rope, positions: torch.Tensor, kind: str):
    freqs = positions.float().unsqueeze(-1) * rope.inv_freq[kind]
    return freqs.cos(), freqs.sin()


@pytest.mark.parametrize("device", DEVICES)
def test_tables_against_the_reference(monkeypatch, device):
    if device == "cpu" and not kernels.interpreting():
        pytest.skip("the kernel on CPU needs Triton's interpreter")
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    rope = Rope(preset("flash"), device)
    g = torch.Generator().manual_seed(0)
    positions = torch.cat([torch.arange(0, 40), torch.randint(0, 1 << 20, (57,), generator=g),
                           torch.tensor([(1 << 20) - 1])]).to(device)
    assert rope.one_launch(positions)
    both = rope.cos_sin_kinds(positions)
    for kind in Rope.KINDS:
        ref_cos, ref_sin = reference(rope, positions, kind)
        one = rope.cos_sin(positions, kind)
        for got in (both[kind], one):
            if device == "cuda":  # the claim: torch's bits
                assert torch.equal(got[0], ref_cos) and torch.equal(got[1], ref_sin), kind
            else:
                torch.testing.assert_close(got[0], ref_cos, rtol=0, atol=2.5e-7)
                torch.testing.assert_close(got[1], ref_sin, rtol=0, atol=2.5e-7)
    # a 2-d tensor of fp32 positions (geometry's window starts [B, windows]) comes back in its own shape
    grid = positions[:96].view(8, 12).float()
    cos, sin = rope.cos_sin(grid, "compress")
    assert cos.shape == (8, 12, rope.inv_freq["compress"].shape[0])
    assert torch.equal(cos.flatten(0, 1), rope.cos_sin(positions[:96], "compress")[0])
    if device == "cuda":
        assert torch.equal(sin, reference(rope, grid, "compress")[1])


def test_supported_names_what_the_kernel_takes():
    inv = torch.zeros(2, 32)
    assert rope_table.supported(torch.arange(3), inv)
    assert rope_table.supported(torch.arange(3).float(), inv)  # the windows' starts (geometry's fp32)
    assert not rope_table.supported(torch.arange(3).double(), inv)
    assert not rope_table.supported(torch.arange(6).view(2, 3), inv)  # flattened by the caller
    assert not rope_table.supported(torch.arange(0), inv)
    assert not rope_table.supported(torch.arange(3), torch.zeros(2, 24))  # a power-of-two half
