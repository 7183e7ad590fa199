"""The MoE decode kernels' tensor-core variant (dsv4.kernels.moe, CONFIG "tensor_cores", DSV4_MOE_TC=1) on tiny FP4
experts against the torch reference (dsv4.model.moe.routed under DSV4_KERNELS=torch), on fresh random weights.

Tolerance: tests/test_qgemv.py's close_chain (an expert's bf16 chain of roundings: within 2**-6 of the largest
output); the dot sums in the tensor cores' order, not the reference's. Bits: every row of a batch equals that row
alone (B = 1, 3, 16), with either dot operand type; with the switch off the kernels give the bits they gave
before the variant existed (a digest of the interpreter's output, recorded at main 3c80f8f).
"""

from __future__ import annotations

import hashlib

import pytest
import torch

from dsv4 import kernels
from dsv4.config import preset
from dsv4.kernels import moe as fused_moe
from dsv4.model import moe as moe_mod
from dsv4.model.rows import rows_alone

from test_qgemv import DEVICES, close_chain, expert_stacks, poisoned

pytest.importorskip("triton")

TC_SMALL = {"tensor_cores": True, "tc_gate_up_block_n": 16, "tc_down_block_n": 32, "tc_block_k": 128}
D, I, FIRST = 128, 64, 16  # rank 1 of 2 over 32 experts: ids 16..31 local


def configured(monkeypatch, **overrides):
    for key, value in {**TC_SMALL, **overrides}.items():
        monkeypatch.setitem(fused_moe.CONFIG, key, value)


def case(device, T: int, seed: int, scale: float = 1.0):
    """16 local FP4 experts, T bf16 tokens (times `scale`), each picking 6 of 32 experts (about half local), the
    routing weights, a shared output; the swiglu limit low enough that both clamps bite."""
    g = torch.Generator().manual_seed(seed)
    stacks = {k: v.to(device) for k, v in expert_stacks("fp4", 16, D, I, g).items()}
    x = (torch.randn(T, D, generator=g) * scale).to(torch.bfloat16).to(device)
    ids = torch.stack([torch.randperm(32, generator=g)[:6] for _ in range(T)]).to(device)
    weights = torch.softmax(torch.randn(T, 6, generator=g), -1).to(torch.bfloat16).to(device)
    shared = torch.randn(T, D, generator=g).to(torch.bfloat16).to(device)
    cfg = preset("tiny")
    cfg.swiglu_limit = 0.3 * scale
    return x, ids, weights, stacks, shared, cfg


def routed(x, ids, weights, stacks, shared, cfg):
    with rows_alone():  # the decode kernels, whatever T (a pooled step's rows)
        return moe_mod.routed(x, ids, weights, stacks, FIRST, cfg, shared)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dot", ["fp16", "bf16"])
@pytest.mark.parametrize("T,split", [(1, 1), (3, 2)])
def test_tc_against_reference(monkeypatch, device, dot, T, split):
    """Both kernels on the tensor cores (with the shared add, and split-K for gate/up) within close_chain of the
    torch reference; the kernels ran with tensor cores (the plain kernels' tiles would not fit these blocks)."""
    x, ids, weights, stacks, shared, cfg = case(device, T, seed=30 + T)
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    ref = routed(x, ids, weights, stacks, shared, cfg)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    configured(monkeypatch, tc_dot=dot, gate_up_split_k=split)
    assert fused_moe.tensor_cores(x, stacks["w1"])
    got = routed(x, ids, weights, stacks, shared, cfg)
    assert got.dtype == torch.bfloat16 and got.shape == (T, D)
    close_chain(got, ref, torch.bfloat16)
    assert torch.equal(got, routed(x, ids, weights, stacks, shared, cfg))  # deterministic


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # silu of a large negative gate: exp(-gate) is inf
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale", [2.0 ** 20, 2.0 ** -30])
def test_tc_fp16_row_scaling(monkeypatch, device, scale):
    """The fp16 dot's power-of-two row scaling: activations far above fp16's range (2**20: unscaled they would
    overflow) and far below it (2**-30: unscaled they would flush to zero) agree with the reference as well as at
    scale 1, relative to the largest output."""
    x, ids, weights, stacks, _, cfg = case(device, 1, seed=40, scale=scale)
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    ref = routed(x, ids, weights, stacks, None, cfg)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    configured(monkeypatch, tc_dot="fp16")
    got = routed(x, ids, weights, stacks, None, cfg)
    assert torch.isfinite(got).all() and got.abs().max() > 0
    close_chain(got, ref, torch.bfloat16)


@pytest.mark.parametrize("device,B,dot", [pytest.param(d, B, dot, marks=[pytest.mark.slow] if B == 16 and d == "cpu" else [])
                                          for d in DEVICES for B, dot in ((1, "fp16"), (3, "fp16"), (3, "bf16"),
                                                                          (16, "fp16"))])
def test_tc_rows_alone(monkeypatch, device, B, dot):
    """Every row of a batch of B has the bits of that row alone (a program computes one row; tiles and the K loop
    are CONFIG's, never the batch's), gate/up split in 2 and compacted."""
    x, ids, weights, stacks, shared, cfg = case(device, B, seed=50 + B)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    configured(monkeypatch, tc_dot=dot, gate_up_split_k=2, compact=True)
    batch = routed(x, ids, weights, stacks, shared, cfg)
    for t in range(B):
        alone = routed(x[t:t + 1], ids[t:t + 1], weights[t:t + 1], stacks, shared[t:t + 1], cfg)
        assert torch.equal(batch[t:t + 1], alone), t


@pytest.mark.filterwarnings("ignore:invalid value encountered")
@pytest.mark.parametrize("device", DEVICES)
def test_tc_reads_no_remote_expert(monkeypatch, device):
    """Local experts no token picked are poisoned (NaN scales): the output is finite and equals the clean one."""
    x, ids, weights, stacks, shared, cfg = case(device, 2, seed=60)
    picked = set((ids - FIRST).flatten().tolist())
    bad = poisoned(stacks, [e for e in range(16) if e not in picked])
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    configured(monkeypatch)
    got = routed(x, ids, weights, bad, shared, cfg)
    assert torch.isfinite(got).all() and torch.equal(got, routed(x, ids, weights, stacks, shared, cfg))


@pytest.mark.skipif(not kernels.interpreting(), reason="the digest is of the interpreter's output")
def test_switch_off_keeps_the_plain_kernels_bits(monkeypatch):
    """tensor_cores off: kernels 1 and 2 give the bits they gave before the variant (fixed inputs, small tiles)."""
    g = torch.Generator().manual_seed(21)
    stacks = expert_stacks("fp4", 16, 128, 64, g)
    x = torch.randn(3, 128, generator=g).to(torch.bfloat16)
    shared = torch.randn(3, 128, generator=g).to(torch.bfloat16)
    ids = torch.tensor([[16, 31, 20, 2, 22, 3], [0, 17, 2, 3, 4, 5], [17, 2, 30, 3, 18, 4]])
    weights = torch.softmax(torch.randn(3, 6, generator=g), -1).to(torch.bfloat16)
    for key, value in {"tensor_cores": False, "block_k_fp4": 32, "gate_up_block_n": 16, "down_block_n": 32}.items():
        monkeypatch.setitem(fused_moe.CONFIG, key, value)
    y = fused_moe.routed(x, ids, weights, [stacks[k] for k in ("w1", "w3", "w2")], 16, 0.3, shared)
    digest = hashlib.sha256(y.view(torch.int16).numpy().tobytes()).hexdigest()
    assert digest == "3661bb6458f96b9a0b15e1570eb6c111f4fc3545141e3a3bf6ade9b7b64b70e8"


def test_tensor_cores_only_for_fp4_and_bf16(monkeypatch):
    """The switch covers FP4 experts with bf16 activations; FP8 experts and fp32 x keep the plain kernels."""
    g = torch.Generator().manual_seed(1)
    fp4, fp8 = expert_stacks("fp4", 2, 128, 128, g), expert_stacks("fp8", 2, 128, 128, g)
    bf16, fp32 = torch.zeros(1, 128, dtype=torch.bfloat16), torch.zeros(1, 128)
    monkeypatch.setitem(fused_moe.CONFIG, "tensor_cores", True)
    assert fused_moe.tensor_cores(bf16, fp4["w1"])
    assert not fused_moe.tensor_cores(fp32, fp4["w1"]) and not fused_moe.tensor_cores(bf16, fp8["w1"])
    monkeypatch.setitem(fused_moe.CONFIG, "tensor_cores", False)
    assert not fused_moe.tensor_cores(bf16, fp4["w1"])
