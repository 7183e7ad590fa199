"""Attention's stacked wq_a / wkv GEMV with q's latent norm and kv's norm + rope in its launch (dsv4.kernels.qkv_norms,
dsv4.layout CONFIG qkv_norms) against its two launches: qgemv's v2 GEMV, then normrope.q_kv_norms at the GEMV's warps,
bit for bit (the same programs' code: the GEMV's, then the norms' rows read back from the GEMV's output); against the
torch reference (the dequantised weight's GEMM, rms_norm, apply_rope) within one bf16 rounding step of the row's
largest value (2**-7: the GEMV sums in another order). Rows: one, a group of 3, and 9 (two groups of 8, the last
repeating its row). The capture without tickets (two launches) gives the same bits; shapes it does not take are
refused by supported. attention._q_res_kv takes the path with the switch on and returns the pair's values."""

from __future__ import annotations

import pytest
import torch

from dsv4.kernels import normrope, qgemv, qkv_norms
from dsv4.model.norm import rms_norm
from dsv4.model.rope import apply_rope
from dsv4.model.rows import rows_alone

pytest.importorskip("triton")

from quantised_cases import DEVICES, quantised  # noqa: E402

N_Q, DIM, HALF, K = 64, 32, 8, 4096  # K of 4,096 and fewer than 2,048 rows: qgemv's XQ tiles, K split in two


def _case(device, T, seed=5):
    g = torch.Generator().manual_seed(seed)
    w = quantised("fp8", N_Q + DIM, K, g).to(device)
    x = torch.randn(T, K, generator=g).to(torch.bfloat16).to(device)
    q_w = (torch.rand(N_Q, generator=g) + 0.5).to(torch.bfloat16).to(device)
    kv_w = (torch.rand(DIM, generator=g) + 0.5).to(torch.bfloat16).to(device)
    angles = torch.rand(T, HALF, generator=g) * 6.0
    return x, w, q_w, kv_w, angles.cos().to(device), angles.sin().to(device)


def _two_launches(x, w, q_w, kv_w, cos, sin):
    y = qgemv.linear(x, w, kernel="v2")
    warps = qgemv.v2_plan(w, K, x.shape[0], False).warps
    return normrope.q_kv_norms(y[:, :N_Q], q_w, y[:, N_Q:], kv_w, 1e-6, cos, sin, num_warps=warps)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T", [1, 3, 9])
def test_one_launch_is_the_two_bit_for_bit(monkeypatch, device, T):
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    monkeypatch.setitem(qgemv.CONFIG, "kernel", "v2")
    x, w, q_w, kv_w, cos, sin = _case(device, T)
    assert qkv_norms.supported(x, w, q_w, kv_w, cos, sin, N_Q, 1)
    assert qgemv.v2_plan(w, K, T, False).splits == 2
    q_res, kv = qkv_norms.q_kv(x, w, q_w, kv_w, 1e-6, cos, sin, N_Q)
    q_two, kv_two = _two_launches(x, w, q_w, kv_w, cos, sin)
    assert torch.equal(q_res, q_two), "q's latent"
    assert torch.equal(kv, kv_two), "kv"
    # the torch reference: the dequantised weight's product, then the norms
    y = x.float() @ w.dequant(torch.float32).T
    q_ref = rms_norm(y[:, :N_Q].to(x.dtype), q_w, 1e-6)
    kv_ref = apply_rope(rms_norm(y[:, N_Q:].to(x.dtype), kv_w, 1e-6), cos, sin)
    for got, ref in ((q_res, q_ref), (kv, kv_ref)):
        torch.testing.assert_close(got.float(), ref.float(), rtol=0, atol=2 ** -7 * float(ref.float().abs().max()))
    # the tickets are left zero for the next launch: a second launch gives the same bits
    again = qkv_norms.q_kv(x, w, q_w, kv_w, 1e-6, cos, sin, N_Q)
    assert torch.equal(again[0], q_res) and torch.equal(again[1], kv)


@pytest.mark.parametrize("device", DEVICES)
def test_without_tickets_the_two_launches(monkeypatch, device):
    """A capture before any eager launch has no tickets: the GEMV and q_kv_norms at its warps, the same bits."""
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    monkeypatch.setitem(qgemv.CONFIG, "kernel", "v2")
    x, w, q_w, kv_w, cos, sin = _case(device, 2)
    one = qkv_norms.q_kv(x, w, q_w, kv_w, 1e-6, cos, sin, N_Q)
    monkeypatch.setattr(qkv_norms, "tickets_for", lambda count, dev: None)
    two = qkv_norms.q_kv(x, w, q_w, kv_w, 1e-6, cos, sin, N_Q)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


def test_shapes_it_does_not_take(monkeypatch):
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    monkeypatch.setitem(qgemv.CONFIG, "kernel", "v2")
    x, w, q_w, kv_w, cos, sin = _case("cpu", 2)
    assert not qkv_norms.supported(x[:, :1024].contiguous(), quantised("fp8", N_Q + DIM, 1024,
                                                                      torch.Generator().manual_seed(1)),
                                   q_w, kv_w, cos, sin, N_Q, 1)  # K of one tile: no split to finish
    assert not qkv_norms.supported(x, w, q_w, kv_w, cos[:1], sin[:1], N_Q, 1)  # a rope row for each row
    assert not qkv_norms.supported(x, w, q_w, kv_w[:16], cos, sin, N_Q, 1)  # kv's weight of its width
    assert not qkv_norms.supported(x, w, q_w, kv_w, cos, sin, N_Q, qgemv.MAX_ROWS + 1)  # the GEMM's rows
    monkeypatch.setitem(qgemv.CONFIG, "kernel", "v3")
    assert not qkv_norms.supported(x, w, q_w, kv_w, cos, sin, N_Q, 1)  # another GEMV family


@pytest.mark.parametrize("device", DEVICES)
def test_attention_takes_it_under_the_switch(monkeypatch, device):
    """attention._q_res_kv with layout CONFIG qkv_norms on launches qkv_norms.q_kv and returns what the pair path
    (the stacked linear, then q_kv_norms) returns at the GEMV's warps: on CPU (the interpreter) those are the default
    path's bits too."""
    from dsv4.config import preset
    from dsv4.layout import CONFIG
    from dsv4.model import attention

    monkeypatch.setenv("DSV4_KERNELS", "triton")
    monkeypatch.setitem(qgemv.CONFIG, "kernel", "v2")
    x, w, q_w, kv_w, cos, sin = _case(device, 3)
    weights = {"wq_a_wkv": w, "wq_a": qgemv.QWeight(w.data[:N_Q], w.scale, "fp8"),
               "wkv": qgemv.QWeight(w.data[N_Q:], w.scale, "fp8", N_Q), "q_norm": q_w, "kv_norm": kv_w}
    cfg = preset("tiny")
    calls = []
    real = qkv_norms.q_kv
    monkeypatch.setattr(qkv_norms, "q_kv", lambda *a: calls.append(1) or real(*a))
    results = {}
    for on in (True, False):
        monkeypatch.setitem(CONFIG, "qkv_norms", on)
        monkeypatch.setitem(CONFIG, "pair_norms", True)
        with rows_alone(True, tokens=1):
            results[on] = attention._q_res_kv(x, weights, cfg, cos, sin)
    assert calls == [1]
    assert results[True][2] and results[False][2]  # kv roped by both
    expected = _two_launches(x, w, q_w, kv_w, cos, sin)
    assert torch.equal(results[True][0], expected[0]) and torch.equal(results[True][1], expected[1])
    if device == "cpu":
        assert torch.equal(results[True][0], results[False][0]) and torch.equal(results[True][1], results[False][1])
