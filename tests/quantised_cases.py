"""Cases and checks shared by the quantised kernels' tests (test_qgemv, test_moe_decode, test_moe_decode_options):
random quantised weights and expert stacks, the routing of rank 1 of 2, and the tolerances (each test file's docstring
states them)."""

from __future__ import annotations

import pytest
import torch

from dsv4 import kernels
from dsv4.formats import QWeight, quantize_fp4, quantize_fp8
from dsv4.kernels import moe as fused_moe
from dsv4.kernels import qgemv

DEVICES = (["cpu"] if kernels.interpreting() else []) + (["cuda"] if torch.cuda.is_available() else [])


def per_device(params, slow_on_cpu=()):
    """(device, *param) cases; those in `slow_on_cpu` join the slow set on CPU only (the interpreter's
    minutes; CI keeps one case of each test), every case runs on CUDA."""
    return [pytest.param(d, *p, marks=[pytest.mark.slow] if d == "cpu" and p in slow_on_cpu else [])
            for d in DEVICES for p in params]


def close(a, b, dtype):
    if dtype == torch.float32:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(a.float(), b.float(), rtol=2 ** -7, atol=1e-5)


def close_chain(a, b, dtype):
    """An expert is a chain of bf16 roundings (gate/up, silu, product, down, weighting), where an
    element one bf16 step apart early moves later sums by several steps: bf16 outputs agree within
    2**-6 of the largest output (each is within ~2**-7 of it from the exact float64 result)."""
    if dtype == torch.float32:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(a.float(), b.float(), rtol=0, atol=2 ** -6 * float(b.float().abs().max()))


def both(monkeypatch, fn):
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    ref = fn()
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    return ref, fn()


def quantised(fmt: str, rows: int, cols: int, g, experts: int = 0) -> QWeight:
    q = quantize_fp8 if fmt == "fp8" else quantize_fp4
    parts = [q(torch.randn(rows, cols, generator=g) * 0.05) for _ in range(max(experts, 1))]
    data, scale = (torch.stack(p) for p in zip(*parts)) if experts else parts[0]
    return QWeight(data, scale, fmt)


def expert_stacks(fmt: str, n: int, D: int, I: int, g) -> dict:
    return {"w1": quantised(fmt, I, D, g, experts=n), "w3": quantised(fmt, I, D, g, experts=n),
            "w2": quantised(fmt, D, I, g, experts=n)}


def poisoned(stacks: dict, experts: list[int], scale_byte: int = 0xFF) -> dict:
    """The same stacks with the given experts' weights unreadable: scales 0xFF (NaN in e8m0, inf in the
    kernels), FP8 data NaN (on a GPU; the interpreter converts it to a number): any read of them
    reaches the output as NaN or inf. Another scale_byte (a kernel that takes only finite scales) makes
    a read change the output instead."""
    out = {}
    for name, w in stacks.items():
        data, scale = w.data.clone(), w.scale.clone()
        for e in experts:
            scale[e].view(torch.uint8).fill_(scale_byte)
            if w.fmt == "fp8":
                data[e].view(torch.uint8).fill_(0x7F)
        out[name] = QWeight(data, scale, w.fmt)
    return out


def route_case(device):
    """Rank 1 of 2 over 32 experts (ids 16..31 local, stack slots 0..15): token 0 picks three local experts
    (slots 1, 2, 4) and three remote ones, token 1 one local (slot 5) and five remote."""
    ids = torch.tensor([[1, 2, 5, 17, 18, 20], [0, 3, 4, 6, 7, 21]], device=device)
    weights = torch.tensor([[0.3, 0.2, 0.1, 0.15, 0.05, 0.2], [0.1, 0.1, 0.2, 0.2, 0.3, 0.1]], device=device)
    return ids, weights, 16


def routed_case(fmt: str, D: int, I: int, dtype, device, seed: int):
    """(stacks, x [2, D], shared [2, D], ids, weights, first): route_case's two tokens over 16 random experts."""
    g = torch.Generator().manual_seed(seed)
    stacks = {k: v.to(device) for k, v in expert_stacks(fmt, 16, D, I, g).items()}
    x = torch.randn(2, D, generator=g).to(dtype).to(device)
    shared = torch.randn(2, D, generator=g).to(dtype).to(device)
    ids, weights, first = route_case(device)
    return stacks, x, shared, ids, weights.to(dtype), first


MOE_SMALL = {"block_k_fp4": 32, "block_k_fp8": 128, "gate_up_block_n": 16, "down_block_n": 32, "shared_block_n": 8}


def moe_configured(monkeypatch, **overrides):
    for key, value in {**MOE_SMALL, **overrides}.items():
        monkeypatch.setitem(fused_moe.CONFIG, key, value)


def tickets_any(device) -> bool:
    return bool(qgemv.tickets_for(1, torch.device(device)).any())
