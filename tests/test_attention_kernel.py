"""The decode attention kernels (dsv4.kernels.attention) against the reference (model.attention._attend).

States are random: ring rows, store rows, this chunk's rows and queries; the masks are the real
ones (step.Step at the chosen position), CSA's picks come from random indexer scores under the
index_topk rule (so early positions have invalid picks). Positions cover the sliding ring before
and after it wraps, and each compressed rate before its first close, at a close inside the chunk
and after several. Tolerance, float32: rtol = atol = 1e-5 (the kernel sums in another order and
in fp32 throughout; the reference also computes in fp32 here). bfloat16 against the float32
reference on the same bf16 inputs: 2**-7 of the output's largest magnitude (the kernel rounds p
to bf16 for the p*v product and the output once). Two runs are bit-identical.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dsv4 import kernels
from dsv4.config import CSA, HCA, SLIDING, preset
from dsv4.kernels import attention as fused
from dsv4.model.attention import _attend
from dsv4.model.rope import Rope
from dsv4.model.step import Step
from dsv4.syncguard import NoHostSync

pytest.importorskip("triton")

DEVICES = (["cpu"] if kernels.interpreting() else []) + (["cuda"] if torch.cuda.is_available() else [])
CAPACITY = 64


def case(kind, pos, T, heads, head_dim, dtype, device, seed=0):
    """(args, extra) for fused.attention / _attend: a random state of one layer of `kind` at `pos`."""
    cfg = dataclasses.replace(preset("tiny"), head_dim=head_dim)
    g = torch.Generator().manual_seed(seed * 1000 + pos * 10 + T)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(dtype).to(device)

    step = Step(torch.tensor(pos, device=device), T, Rope(cfg, device), cfg.sliding_window)
    visible, _ = step.sliding()
    cos, sin = step.cos_sin("main" if kind == SLIDING else "compress")
    sink = (torch.randn(heads, generator=g) * 2).to(device)
    args = (rand(T, heads, head_dim) * 3, rand(cfg.sliding_window, head_dim), rand(T, head_dim), visible, sink,
            cos, sin)
    if kind == SLIDING:
        return args, {}
    m = cfg.compress_rates[kind]
    rows = CAPACITY // m + 2
    win = step.windows(m, 2 * m if kind == CSA else m, rows)
    comp, new = rand(rows, head_dim), rand(win.wids.shape[0], head_dim)
    if kind == HCA:
        return args, dict(comp=comp, new=new, committed=win.committed, new_visible=win.visible)
    scores = torch.randn(T, rows + new.shape[0], generator=g).to(device)
    scores = scores.masked_fill(~torch.cat([win.committed.expand(T, -1), win.visible], -1), float("-inf"))
    k = min(cfg.index_topk, scores.shape[-1])
    ordered, order = torch.sort(scores, dim=-1, descending=True, stable=True)
    return args, dict(comp=comp, new=new, sel=order[:, :k], valid=ordered[:, :k] > float("-inf"))


def check(kind, pos, T, heads, head_dim, dtype, device, monkeypatch):
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    args, extra = case(kind, pos, T, heads, head_dim, dtype, device)
    assert fused.supported(*args, **extra)
    got = fused.attention(*args, **extra)
    assert got.dtype == dtype and got.shape == args[0].shape
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    if dtype == torch.float32:
        torch.testing.assert_close(got, _attend(*args, **extra), rtol=1e-5, atol=1e-5)
    else:
        up = [a.float() if a.is_floating_point() else a for a in args]
        ref = _attend(*up, **{k: v.float() if v.is_floating_point() else v for k, v in extra.items()})
        assert float((got.float() - ref).abs().max()) <= 2 ** -7 * float(ref.abs().max())
    return got


# Sliding window 8: ring not yet full (pos 3), full (8), wrapped (21). CSA rate 4: before the first close
# (pos 1), the close inside the chunk (3 with T=1; 2 with T=3), after several (21, 45). HCA rate 16: before
# (5), the close (15), after (40); the chunk of 8 at 12 crosses a close.
POSITIONS = [(SLIDING, 0, 1), (SLIDING, 3, 1), (SLIDING, 8, 1), (SLIDING, 21, 3),
             (CSA, 1, 1), (CSA, 3, 1), (CSA, 2, 3), (CSA, 21, 1), (CSA, 45, 2),
             (HCA, 5, 1), (HCA, 15, 1), (HCA, 40, 1), (HCA, 12, 8)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind,pos,T", POSITIONS)
def test_few_heads(monkeypatch, device, kind, pos, T):
    """Tiny's shape (2 heads of 32 on a rank): the broadcast-multiply path."""
    check(kind, pos, T, 2, 32, torch.float32, device, monkeypatch)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind,pos,T", [p for p in POSITIONS if p[2] == 1] + [(CSA, 45, 2)])
def test_tensor_core_heads(monkeypatch, device, kind, pos, T):
    """16 heads of 64: the tl.dot path; heads not a multiple of the block (20) masked."""
    check(kind, pos, T, 16, 64, torch.float32, device, monkeypatch)
    if kind != SLIDING:
        check(kind, pos, T, 20, 64, torch.float32, device, monkeypatch)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config", [{"block_n": 16, "tiles": 2, "block_h": 16}, {"block_n": 16, "tiles": 3}])
@pytest.mark.parametrize("kind,pos,T", [(CSA, 45, 1), (HCA, 40, 2)])
def test_split_configs(monkeypatch, device, config, kind, pos, T):
    """Several tiles per program and head blocks per query: the launch variants the benchmark tries."""
    for key, value in config.items():
        monkeypatch.setitem(fused.CONFIG, key, value)
    check(kind, pos, T, 32, 64, torch.float32, device, monkeypatch)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("heads,kind", [(2, CSA), (16, HCA)])
def test_bfloat16(monkeypatch, device, heads, kind):
    check(kind, 45, 1, heads, 64, torch.bfloat16, device, monkeypatch)


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_and_no_host_sync(monkeypatch, device):
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    args, extra = case(HCA, 40, 2, 16, 64, torch.float32, device)
    first = fused.attention(*args, **extra)
    with NoHostSync():
        second = fused.attention(*args, **extra)
    assert torch.equal(first, second)


def test_unsupported_shapes_take_the_reference(monkeypatch):
    """A chunk longer than MAX_T (prefill), a head_dim not a power of two: the model keeps _attend."""
    args, extra = case(CSA, 21, 9, 2, 32, torch.float32, "cpu")
    assert not fused.supported(*args, **extra)
    args, extra = case(HCA, 21, 1, 2, 48, torch.float32, "cpu")
    assert not fused.supported(*args, **extra)


def test_model_decode_takes_the_kernel(monkeypatch):
    """Every layer of a decode step (sliding, CSA, HCA) dispatches to the kernel; a prefill of 9 does not."""
    import dsv4

    calls, kernel = [], fused.attention
    monkeypatch.setattr(fused, "attention", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    model = dsv4.load("tiny", device=DEVICES[0], dtype=torch.float32)  # CPU only through the interpreter
    state = model.new_state(32)
    model.prefill(state, list(range(1, 10)))
    assert not calls
    model.decode(state, 10)
    assert len(calls) == model.cfg.num_hidden_layers
