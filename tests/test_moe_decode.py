"""The two-launch MoE decode (dsv4.kernels.moe) against the torch reference (gather, dequantise, matmuls) on
fresh random weights: the routed experts, the shared expert's kernel 1, kernel 1's options, remote experts unread.
Kernel 2's options and the fused launches: test_moe_decode_options.py.

On CPU the kernels run through Triton's interpreter (conftest), on a GPU compiled. Tolerances: fp32
outputs within rtol = atol = 1e-5 (sums in another order); an expert's bf16 chain of roundings within 2**-6 of the
largest output (close_chain). Options that must keep the bits are compared with torch.equal.
"""

from __future__ import annotations

import pytest
import torch

from dsv4 import kernels
from dsv4.config import preset
from dsv4.kernels import moe as fused_moe
from dsv4.model import moe as moe_mod
from dsv4.formats import QWeight

pytest.importorskip("triton")

from quantised_cases import (DEVICES, both, close_chain, expert_stacks, moe_configured, per_device, poisoned,
                             quantised, route_case, routed_case, tickets_any)  # noqa: E402


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,T,dtype", [("fp4", 2, torch.float32), ("fp4", 1, torch.bfloat16),
                                         ("fp8", 2, torch.bfloat16)])
def test_moe_decode_against_reference(monkeypatch, device, fmt, T, dtype):
    """moe.routed's decode branch: the two kernels against gathering, dequantising and matmuls. The swiglu
    limit is low enough that both clamps bite."""
    g = torch.Generator().manual_seed(3)
    D, I = 128, 64 if fmt == "fp4" else 128
    stacks = {k: v.to(device) for k, v in expert_stacks(fmt, 16, D, I, g).items()}
    x = torch.randn(T, D, generator=g).to(dtype).to(device)
    ids, weights, first = route_case(device)
    ids, weights = ids[:T], weights[:T].to(dtype)
    cfg = preset("tiny")
    cfg.swiglu_limit = 0.3
    assert fused_moe.supported(x, [stacks[k] for k in ("w1", "w3", "w2")])
    ref, got = both(monkeypatch, lambda: moe_mod.routed(x, ids, weights, stacks, first, cfg))
    assert got.dtype == dtype and got.shape == (T, D)
    close_chain(got, ref, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,dtype", [("fp4", torch.bfloat16), ("fp8", torch.float32)])
def test_moe_shared_add_in_kernel(monkeypatch, device, fmt, dtype):
    """CONFIG shared_add: the shared expert's output added in kernel 2's store has the bits of the torch add after
    it (the routed sum rounded, plus shared, rounded once), for a token with local experts and one whose picks
    are nearly all remote."""
    stacks, x, shared, ids, weights, first = routed_case(fmt, 128, 64 if fmt == "fp4" else 128, dtype, device, 11)
    cfg = preset("tiny")
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    moe_configured(monkeypatch, shared_add=False)
    apart = moe_mod.routed(x, ids, weights, stacks, first, cfg, shared)
    assert torch.equal(apart, moe_mod.routed(x, ids, weights, stacks, first, cfg) + shared)
    moe_configured(monkeypatch, shared_add=True)
    assert torch.equal(moe_mod.routed(x, ids, weights, stacks, first, cfg, shared), apart)


@pytest.mark.parametrize("device,fmt,dtype", per_device(
    [("fp4", torch.bfloat16), ("fp8", torch.float32)], slow_on_cpu=[("fp8", torch.float32)]))
def test_moe_gate_up_variants(monkeypatch, device, fmt, dtype):
    """Kernel 1's options: compact rows give the same bits as the plain grid; split-K (2 and 4 splits, K
    of 4 K tiles) gives the same bits with the sum fused or in a second launch, whether compacted or not,
    and agrees with the reference within close_chain; tickets back at 0. Two tokens, rank 1 of 2. (Triton's
    interpreter runs the programs one after another: the GPU run checks the race for the last ticket.)"""
    g = torch.Generator().manual_seed(7)
    D, I = 128 if fmt == "fp4" else 512, 32 if fmt == "fp4" else 128
    stacks = {k: v.to(device) for k, v in expert_stacks(fmt, 16, D, I, g).items()}
    x = torch.randn(2, D, generator=g).to(dtype).to(device)
    ids, weights, first = route_case(device)
    weights = weights.to(dtype)
    cfg = preset("tiny")
    cfg.swiglu_limit = 0.3
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    ref = moe_mod.routed(x, ids, weights, stacks, first, cfg)
    monkeypatch.setenv("DSV4_KERNELS", "triton")

    def run(**overrides):
        moe_configured(monkeypatch, **overrides)
        return moe_mod.routed(x, ids, weights, stacks, first, cfg)

    plain = run(gate_up_split_k=1, compact=False)
    assert torch.equal(run(gate_up_split_k=1, compact=True), plain)
    for splits in (2, 4):
        split = run(gate_up_split_k=splits, compact=False, fused_sum=True)
        close_chain(split, ref, dtype)
        assert not tickets_any(device)
        for compact, fused in ((False, False), (True, True), (True, False)):
            assert torch.equal(run(gate_up_split_k=splits, compact=compact, fused_sum=fused), split), (splits, compact)


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # the witness computes with the poison
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["fp4", "fp8"])
def test_moe_decode_reads_no_remote_expert(monkeypatch, device, fmt):
    """Remote experts read nothing: the local experts no token picked (stack slots 0, 3, 6, 15; the
    reference's clamp reads slot 0 for remote ids below the range) are poisoned, and the output is still finite and
    bit-identical to the output with them intact. Two runs are bit-identical."""
    g = torch.Generator().manual_seed(4)
    D, I = 128, 128
    clean = expert_stacks(fmt, 16, D, I, g)
    bad = poisoned(clean, [0, 3, 6, 15])
    clean, bad = ({k: v.to(device) for k, v in s.items()} for s in (clean, bad))
    x = torch.randn(2, D, generator=g).to(device)
    ids, weights, first = route_case(device)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    cfg = preset("tiny")
    got = moe_mod.routed(x, ids, weights, bad, first, cfg)
    assert torch.isfinite(got).all()
    assert torch.equal(got, moe_mod.routed(x, ids, weights, clean, first, cfg))
    assert torch.equal(got, moe_mod.routed(x, ids, weights, bad, first, cfg))
    # The witness: the path that clamps remote ids into the stack reads poisoned slot 0.
    monkeypatch.setattr(fused_moe, "supported", lambda x, stacks, rows=None: False)
    assert not torch.isfinite(moe_mod.routed(x, ids, weights, bad, first, cfg)).all()
    monkeypatch.undo()
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    # A token whose experts are all remote gets exactly 0.
    remote = torch.tensor([[0, 1, 2, 3, 4, 5]], device=device)
    assert torch.equal(moe_mod.routed(x[:1], remote, weights[:1], bad, first, cfg), torch.zeros(1, D, device=device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shared_expert_gate_up(monkeypatch, device, dtype):
    """The shared expert with kernel 1 on its gate/up: this rank's rows of w1/w3 start inside a scale block."""
    g = torch.Generator().manual_seed(6)
    D, I_full = 256, 384
    w1, w3, w2 = quantised("fp8", I_full, D, g), quantised("fp8", I_full, D, g), quantised("fp8", D, I_full, g)
    rows = slice(64, 256)

    def rows_of(w):
        return QWeight(w.data[rows].contiguous(), w.scale[0:2].contiguous(), "fp8", rows.start, 0)

    cols = QWeight(w2.data[:, 128:320].contiguous(), w2.scale[:, 1:3].contiguous(), "fp8", 0, 128)
    s = {"w1": rows_of(w1).to(device), "w3": rows_of(w3).to(device), "w2": cols.to(device)}
    x = torch.randn(2, D, generator=g).to(dtype).to(device)
    assert fused_moe.shared_supported(x, s["w1"], s["w3"])
    ref, got = both(monkeypatch, lambda: moe_mod.shared_expert(x, s, 0.5))
    close_chain(got, ref, dtype)


def test_moe_kernels_run_on_cuda_only_in_auto_mode(monkeypatch):
    """GPU-checked: "auto" runs them on CUDA tensors and keeps the reference on CPU ones."""
    assert fused_moe.GPU_CHECKED is True
    monkeypatch.setenv("DSV4_KERNELS", "auto")
    assert not kernels.enabled(fused_moe, torch.zeros(1))


@pytest.mark.slow
@pytest.mark.skipif(not kernels.interpreting(), reason="the benchmark's CPU run needs Triton's interpreter")
def test_moe_benchmark_runs_on_cpu(monkeypatch, capsys):
    """benchmarks/moe_bench.py end to end on `tiny` widths through the interpreter (timings faked): every arm
    within tolerance of the reference, the compact and fused-sum arms bit-equal to their base, bytes counted."""
    import json
    import sys

    import benchmarks.moe_bench as bench
    import benchmarks.qgemv_bench as qb

    monkeypatch.setattr(qb, "DEVICE", "cpu")
    monkeypatch.setattr(qb, "L2_DEFEAT", 1 << 12)
    monkeypatch.setattr(qb, "timed", lambda fn, calls: [fn(i) for i in range(2)] and 1.0)
    monkeypatch.setattr(qb, "bandwidth", lambda: 1e12)
    monkeypatch.setattr(bench, "preset", lambda name: preset("tiny"))
    monkeypatch.setitem(fused_moe.CONFIG, "block_k_fp4", 32)
    monkeypatch.setitem(fused_moe.CONFIG, "block_k_fp8", 128)
    monkeypatch.setattr(sys, "argv", ["moe_bench", "--tokens", "2", "--calls", "2",
                                      "--arms", "^(base|compact|split2|split2_compact|shared_split2)$"])
    bench.main()
    lines = capsys.readouterr().out.splitlines()
    records = [json.loads(line.split(" ", 1)[1]) for line in lines if line.startswith("MOE ")]
    assert {(r["op"], r["variant"]) for r in records} == {
        *((op, v) for op in ("gate_up", "routed") for v in ("base", "compact", "split2", "split2_compact")),
        ("shared_gate_up", "base"), ("shared_gate_up", "shared_split2")}
    assert all("error" not in r and r["max_rel_err"] <= qb.TOLERANCE and r["bytes"] > 0 for r in records), records
    assert all(r["bit_equal_base"] for r in records if r["variant"] in ("base", "compact"))
    assert any(line.startswith("MOE_BEST") for line in lines)
