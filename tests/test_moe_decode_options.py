"""The two-launch MoE decode's options (dsv4.kernels.moe CONFIG) keep the plain kernels' bits: paired gate/up and
split down, compact rows, split-K rows alone, the shared expert's split, the routed and shared kernel 1 in one launch.
The decode against its reference: test_moe_decode.py.

On CPU the kernels run through Triton's interpreter (conftest), on a GPU compiled. Tolerances: fp32
outputs within rtol = atol = 1e-5 (sums in another order); an expert's bf16 chain of roundings within 2**-6 of the
largest output (close_chain). Options that must keep the bits are compared with torch.equal.
"""

from __future__ import annotations

import pytest
import torch

from dsv4.config import preset
from dsv4.kernels import moe as fused_moe
from dsv4.model import linear as linear_mod
from dsv4.model import moe as moe_mod
from dsv4.formats import QWeight

pytest.importorskip("triton")

from quantised_cases import (DEVICES, close_chain, expert_stacks, moe_configured, per_device, quantised,
                             route_case, routed_case, tickets_any)  # noqa: E402


# Both CPU cases in the slow set since session 35 (the interpreter's 75 s for the fp4 case alone: the cold suite's 15
# minutes); the CUDA cases run in the GPU suite, the pair kernels' other CPU tests below stay in CI.
@pytest.mark.parametrize("device,fmt,dtype", per_device(
    [("fp4", torch.bfloat16), ("fp8", torch.float32)], slow_on_cpu=[("fp4", torch.bfloat16), ("fp8", torch.float32)]))
def test_moe_paired_and_split_down_keep_the_bits(monkeypatch, device, fmt, dtype):
    """CONFIG gate_up_paired (FP4 gate and up in one loop) and down_split_experts (kernel 2 a program per
    (row block, token, expert), the terms summed in routing order by the last ticket or a second launch) give
    the plain kernels' bits: with and without the shared add, with split-K, for a token whose experts are
    mostly local and one whose are mostly remote; tickets back at 0. Rows alone equal the batch. (In fp32 the
    plain kernel 2 keeps running: its multiply-add is fused, which a sum of stored terms cannot repeat.)"""
    stacks, x, shared, ids, weights, first = routed_case(fmt, 128 if fmt == "fp4" else 512, 64 if fmt == "fp4" else 128,
                                                         dtype, device, 12)
    cfg = preset("tiny")
    cfg.swiglu_limit = 0.3
    monkeypatch.setenv("DSV4_KERNELS", "triton")

    def run(add=None, rows=slice(None), **overrides):
        moe_configured(monkeypatch, **{"gate_up_paired": False, "down_split_experts": False, "down_split_tokens": 4,
                                       **overrides})
        return moe_mod.routed(x[rows], ids[rows], weights[rows], stacks, first, cfg,
                              None if add is None else add[rows])

    for add, split_k, cases in ((shared, 1, ((True, False, True), (False, True, True), (True, True, False))),
                                (None, 2, ((True, True, True),))):
        plain = run(add, gate_up_split_k=split_k)
        for paired, down_split, fused in cases:
            got = run(add, gate_up_split_k=split_k, gate_up_paired=paired, down_split_experts=down_split,
                      fused_sum=fused)
            assert torch.equal(got, plain), (add is None, split_k, paired, down_split, fused)
            assert not tickets_any(device)
    both_on = dict(gate_up_paired=True, down_split_experts=True)
    batch = run(shared, **both_on)
    for t in range(2):
        assert torch.equal(run(shared, slice(t, t + 1), **both_on), batch[t:t + 1])


@pytest.mark.parametrize("device", DEVICES)
def test_moe_compact_rows(monkeypatch, device):
    """The prefix count: slot j runs the j-th local row in row order; slots past the local rows run nothing
    (a batch of one token with all experts remote gets 0; one with all local fills every slot)."""
    g = torch.Generator().manual_seed(8)
    D, I = 64, 32
    stacks = {k: v.to(device) for k, v in expert_stacks("fp4", 16, D, I, g).items()}
    x = torch.randn(3, D, generator=g).to(device)
    ids = torch.tensor([[16, 31, 20, 21, 22, 23], [0, 1, 2, 3, 4, 5], [17, 2, 30, 3, 18, 4]], device=device)
    weights = torch.softmax(torch.randn(3, 6, generator=g), -1).to(device)
    cfg = preset("tiny")
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    moe_configured(monkeypatch, compact=False)
    plain = moe_mod.routed(x, ids, weights, stacks, 16, cfg)
    moe_configured(monkeypatch, compact=True)
    got = moe_mod.routed(x, ids, weights, stacks, 16, cfg)
    assert torch.equal(got, plain) and torch.equal(got[1], torch.zeros_like(got[1]))


@pytest.mark.parametrize("device", DEVICES)
def test_moe_split_rows_alone(monkeypatch, device):
    """Split-K and compact rows keep a token's bits whatever the batch: each token of a batch of 3 equals the
    token alone (the split is CONFIG's, never the rows')."""
    g = torch.Generator().manual_seed(10)
    D, I = 64, 32
    stacks = {k: v.to(device) for k, v in expert_stacks("fp4", 16, D, I, g).items()}
    x = torch.randn(3, D, generator=g).to(torch.bfloat16).to(device)
    ids = torch.tensor([[16, 31, 20, 2, 22, 3], [0, 17, 2, 3, 4, 5], [17, 2, 30, 3, 18, 4]], device=device)
    weights = torch.softmax(torch.randn(3, 6, generator=g), -1).to(torch.bfloat16).to(device)
    cfg = preset("tiny")
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    moe_configured(monkeypatch, compact=True, gate_up_split_k=2)
    batch = moe_mod.routed(x, ids, weights, stacks, 16, cfg)
    for t in range(3):
        assert torch.equal(batch[t:t + 1], moe_mod.routed(x[t:t + 1], ids[t:t + 1], weights[t:t + 1], stacks, 16, cfg))


@pytest.mark.parametrize("device", DEVICES)
def test_shared_gate_up_split(monkeypatch, device):
    """The shared expert's gate/up split over K (its rows start inside a scale block): fused or second-launch
    sum give the same bits, within close_chain of the reference."""
    g = torch.Generator().manual_seed(9)
    D, I_full = 512, 192
    w1, w3 = quantised("fp8", I_full, D, g), quantised("fp8", I_full, D, g)
    rows = slice(64, 192)

    def rows_of(w):
        return QWeight(w.data[rows].contiguous(), w.scale[0:2].contiguous(), "fp8", rows.start, 0).to(device)

    a, b = rows_of(w1), rows_of(w3)
    x = torch.randn(2, D, generator=g).to(torch.bfloat16).to(device)
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    ref = moe_mod.swiglu_act(linear_mod.linear(x, a), linear_mod.linear(x, b), 0.5)
    out = {}
    for fused in (True, False):
        moe_configured(monkeypatch, shared_split_k=4, fused_sum=fused)
        out[fused] = fused_moe.shared_gate_up(x, a, b, 0.5)
    assert torch.equal(out[True], out[False]) and not tickets_any(device)
    close_chain(out[True], ref, torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
def test_routed_and_shared_gate_up_in_one_launch(monkeypatch, device):
    """CONFIG shared_launch: the routed rows' and the shared expert's kernel 1 in one launch give each its own
    launch's bits (FP4 experts with split-K 2, an FP8 shared slice starting inside a scale block with split-K 4),
    tickets back at 0; without tickets (fused_sum off) it falls back to the two launches, same bits."""
    g = torch.Generator().manual_seed(13)
    D, I, I_full = 256, 64, 192
    stacks = {k: v.to(device) for k, v in expert_stacks("fp4", 16, D, I, g).items()}
    sw1, sw3 = (quantised("fp8", I_full, D, g) for _ in range(2))
    rows = slice(64, 192)

    def rows_of(w):
        return QWeight(w.data[rows].contiguous(), w.scale[0:2].contiguous(), "fp8", rows.start, 0).to(device)

    a, b = rows_of(sw1), rows_of(sw3)
    x = torch.randn(2, D, generator=g).to(torch.bfloat16).to(device)
    ids, _, first = route_case(device)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    moe_configured(monkeypatch, gate_up_split_k=2, shared_split_k=4, block_k_fp4=64)
    alone = (fused_moe._gate_up(x, stacks["w1"], stacks["w3"], ids, first, 16, 6, 0.5, fused_moe.CONFIG["gate_up_block_n"],
                                2), fused_moe.shared_gate_up(x, a, b, 0.5))
    for fused in (True, False):
        moe_configured(monkeypatch, gate_up_split_k=2, shared_split_k=4, block_k_fp4=64, shared_launch=True,
                       fused_sum=fused)
        both = fused_moe.routed_and_shared_gate_up(x, ids, stacks["w1"], stacks["w3"], first, a, b, 0.5)
        local = (ids - first >= 0) & (ids - first < 16)  # rows of other ranks' experts are never written
        assert torch.equal(both[0][local.flatten()], alone[0][local.flatten()]), fused
        assert torch.equal(both[1], alone[1]) and not tickets_any(device), fused
