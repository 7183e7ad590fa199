"""RMSNorm + RoPE in one launch (dsv4.kernels.normrope) against the reference composition
apply_rope(rms_norm(x, w)) / apply_rope(unweighted_rms_norm(x)) of dsv4.model (DSV4_KERNELS=torch).

Tolerances: fp32 within rtol = atol = 1e-6 (the kernel sums the squares in another order, so rstd
may differ in its last bit); bf16 and fp16 within one rounding step of the output's dtype, relative to
the row's largest value (rtol = atol = 2**-7 for bf16, 2**-10 for fp16: a last-bit difference of rstd
can flip one rounding of the normed value, which the rotation carries into both channels of its pair).
The non-rotated channels are the normed values themselves. The model's attention through the kernel
agrees with it through the two separate kernels within the same bounds.
"""

from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4 import kernels
from dsv4.kernels import normrope
from dsv4.model.norm import rms_norm, unweighted_rms_norm
from dsv4.model.rope import apply_rope
from batching import decode_twice

pytest.importorskip("triton")

DEVICES = (["cpu"] if kernels.interpreting() else []) + (["cuda"] if torch.cuda.is_available() else [])

# A tiny model through every kernel: minutes under the interpreter, so its CPU case joins the slow set
# (DSV4_SLOW=1); CI keeps the kernels' own tests, and on a GPU machine the CUDA case runs.
MODEL_DEVICES = [pytest.param(d, marks=[pytest.mark.slow] if d == "cpu" else []) for d in DEVICES]
TOL = {torch.float32: 1e-6, torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10}


def reference(x, weight, eps, cos, sin, monkeypatch):
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    normed = unweighted_rms_norm(x, eps) if weight is None else rms_norm(x, weight, eps)
    return apply_rope(normed, cos, sin)


def inputs(device, dtype, shape, half, weight_dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 3).to(dtype).to(device)
    angles = torch.rand(shape[0], half, generator=g) * 6.0
    weight = None if weight_dtype is None else (torch.rand(shape[-1], generator=g) + 0.5).to(weight_dtype).to(device)
    return x, weight, angles.cos().to(device), angles.sin().to(device)


CASES = [  # (shape, half, weight dtype: None = q's unweighted per-head norm, "x" = x's dtype)
    ((3, 4, 64), 8, None),      # q [T, heads, hd]
    ((2, 5, 80), 16, None),     # a head dim that is not a power of two
    ((3, 64), 8, "x"),          # kv [T, hd], weight in x's dtype
    ((2, 96), 16, torch.float32),  # kv, fp32 weight
    ((1, 32), 16, "x"),         # rope over the whole row
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_norm_rope_matches_the_reference_composition(monkeypatch, device, dtype, case):
    shape, half, wd = CASES[case]
    x, weight, cos, sin = inputs(device, dtype, shape, half, dtype if wd == "x" else wd, seed=case)
    assert normrope.supported(x, weight, cos, sin)
    want = reference(x, weight, 1e-6, cos, sin, monkeypatch)
    got = normrope.norm_rope(x, weight, 1e-6, cos, sin)
    assert got.dtype == want.dtype == dtype and got.shape == want.shape
    scale = want.float().abs().amax(-1, keepdim=True)
    err = (got.float() - want.float()).abs()
    assert (err <= TOL[dtype] * (want.float().abs() + scale)).all(), float((err / scale).max())


def test_shapes_the_kernel_does_not_take():
    x, weight, cos, sin = inputs("cpu", torch.float32, (2, 64), 8, torch.float32, seed=9)
    assert normrope.supported(x, weight, cos, sin)
    assert normrope.supported(x[:, :48], weight[:48], cos, sin)  # strided rows, each contiguous: read in place
    assert not normrope.supported(x[:, ::2], weight[:32], cos, sin)  # strided channels
    assert not normrope.supported(x, weight, cos[:, :6].contiguous(), sin[:, :6].contiguous())  # half not 2^k
    assert not normrope.supported(x, weight[:32], cos, sin)  # weight of another width
    assert not normrope.supported(x.to(torch.bfloat16), weight.to(torch.float16), cos, sin)


@pytest.mark.parametrize("device", MODEL_DEVICES)
def test_model_through_the_fused_kernel(monkeypatch, device):
    """tiny (sliding, CSA, HCA layers), a prefill and decode steps: the same greedy tokens and logits within
    1e-5 of the largest as through the separate norm and rope kernels."""
    from dsv4.layout import CONFIG

    monkeypatch.setenv("DSV4_KERNELS", "triton")
    monkeypatch.setitem(CONFIG, "pair_norms", False)  # kv's norm in its own launch, as the count below says
    model = dsv4.load("tiny", device=device, dtype=torch.float32, seed=6)
    calls = []
    real = normrope.norm_rope
    monkeypatch.setattr(normrope, "norm_rope", lambda *a: calls.append(1) or real(*a))

    def run():
        state = model.new_state(32)
        logits = [model.prefill(state, list(range(3, 12)))]
        for token in (12, 13, 14):
            logits.append(model.decode(state, token))
        return torch.stack(logits)

    fused = run()
    assert len(calls) == 2 * model.cfg.num_hidden_layers * 4  # q and kv of every layer, 4 steps
    monkeypatch.setattr(normrope, "supported", lambda *a: False)
    separate = run()
    assert torch.equal(fused.argmax(-1), separate.argmax(-1))
    torch.testing.assert_close(fused, separate, rtol=0, atol=1e-5 * float(separate.abs().max()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("weight_dtype", ["x", torch.float32])
def test_q_kv_norms_are_the_two_launches_bit_for_bit(device, dtype, weight_dtype):
    """q_kv_norms (layout CONFIG pair_norms): q's latent norm and kv's norm and rope in one launch, each read as a
    column slice of one stacked projection (as attention's wq_a/wkv output), give the bits of norm.rms_norm and
    norm_rope launched apart: each program runs its own kernel's code."""
    from dsv4.kernels import norm

    g = torch.Generator().manual_seed(11)
    T, N, dim, half = 3, 96, 64, 8
    stacked = (torch.randn(T, N + dim, generator=g) * 3).to(dtype).to(device)
    q_a, kv_a = stacked.split([N, dim], dim=-1)
    wd = dtype if weight_dtype == "x" else weight_dtype
    q_w = (torch.rand(N, generator=g) + 0.5).to(wd).to(device)
    kv_w = (torch.rand(dim, generator=g) + 0.5).to(wd).to(device)
    angles = torch.rand(T, half, generator=g) * 6.0
    cos, sin = angles.cos().to(device), angles.sin().to(device)
    assert normrope.q_kv_supported(q_a, q_w, kv_a, kv_w, cos, sin)
    q_res, kv = normrope.q_kv_norms(q_a, q_w, kv_a, kv_w, 1e-6, cos, sin)
    assert torch.equal(q_res, norm.rms_norm(q_a, q_w, 1e-6))
    assert torch.equal(kv, normrope.norm_rope(kv_a, kv_w, 1e-6, cos, sin))
    assert not normrope.q_kv_supported(q_a, None, kv_a, kv_w, cos, sin)  # q's latent norm is weighted
    assert not normrope.q_kv_supported(q_a[:2], q_w, kv_a, kv_w, cos, sin)  # rows of both


@pytest.mark.parametrize("device", MODEL_DEVICES)
def test_model_pair_norms_change_no_bit(monkeypatch, device):
    """tiny's decode steps with q's and kv's norms in one launch (pair_norms): the logits and the state's bytes of
    the separate launches, bit for bit (each program runs its own kernel's code)."""
    from dsv4.layout import CONFIG

    model = dsv4.load("tiny", device=device, dtype=torch.float32, seed=6)
    launched = []
    real = normrope.q_kv_norms
    monkeypatch.setattr(normrope, "q_kv_norms", lambda *a: launched.append(1) or real(*a))

    def run(on):
        monkeypatch.setitem(CONFIG, "pair_norms", on)
        return decode_twice(model, monkeypatch)

    (paired, paired_digest), (apart, apart_digest) = run(True), run(False)
    assert len(launched) == 2 * model.cfg.num_hidden_layers
    assert torch.equal(paired, apart) and paired_digest == apart_digest
