"""The decode attention kernels (dsv4.kernels.attention) against the reference (model.attention._attend).

States are random: ring rows, store rows, this chunk's rows and queries; the masks are the real
ones (step.Step at the chosen position), CSA's picks come from random indexer scores under the
index_topk rule (so early positions have invalid picks). Positions cover the sliding ring before
and after it wraps, and each compressed rate before its first close, at a close inside the chunk
and after several. Tolerance, float32: rtol = atol = 1e-5 (the kernel sums in another order and
in fp32 throughout; the reference also computes in fp32 here). bfloat16 against the float32
reference on the same bf16 inputs: 2**-7 of the output's largest magnitude (the kernel rounds p
to bf16 for the p*v product and the output once). Two runs are bit-identical. The fused combine (CONFIG
fused_combine): the same bounds; against the two launches see test_fused_combine.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dsv4 import kernels
from dsv4.config import CSA, HCA, SLIDING, preset
from dsv4.kernels import attention as fused
from dsv4.kernels import qgemv
from dsv4.model.attention import _attend
from dsv4.model.rope import Rope
from dsv4.model.step import Step
from dsv4.syncguard import NoHostSync

pytest.importorskip("triton")

DEVICES = (["cpu"] if kernels.interpreting() else []) + (["cuda"] if torch.cuda.is_available() else [])
CAPACITY = 64


def case(kind, pos, T, heads, head_dim, dtype, device, seed=0, window=None, capacity=CAPACITY):
    """(args, extra) for fused.attention / _attend: a random state of one layer of `kind` at `pos` (tiny's, or
    with a sliding window of `window` rows)."""
    cfg = dataclasses.replace(preset("tiny"), head_dim=head_dim)
    cfg = dataclasses.replace(cfg, sliding_window=window or cfg.sliding_window)
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
    rows = capacity // m + 2
    win = step.windows(m, 2 * m if kind == CSA else m, rows)
    comp, new = rand(rows, head_dim), rand(win.wids.shape[0], head_dim)
    if kind == HCA:
        return args, dict(comp=comp, new=new, committed=win.committed, new_visible=win.visible)
    scores = torch.randn(T, rows + new.shape[0], generator=g).to(device)
    scores = scores.masked_fill(~torch.cat([win.committed.expand(T, -1), win.visible], -1), float("-inf"))
    k = min(cfg.index_topk, scores.shape[-1])
    ordered, order = torch.sort(scores, dim=-1, descending=True, stable=True)
    return args, dict(comp=comp, new=new, sel=order[:, :k], valid=ordered[:, :k] > float("-inf"))


def check(kind, pos, T, heads, head_dim, dtype, device, monkeypatch, **state):
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    args, extra = case(kind, pos, T, heads, head_dim, dtype, device, **state)
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
@pytest.mark.parametrize("head_dim", [64, 256])
@pytest.mark.parametrize("kind,pos,T", [(SLIDING, 21, 3), (CSA, 45, 1), (HCA, 40, 2)])
def test_combine_split_d_keeps_the_bits(monkeypatch, device, head_dim, kind, pos, T):
    """CONFIG combine_split_d (the combine a program per chunk of columns): the same output bits as a program a
    head, in fp32 and bf16 (head_dim 256: two chunks of the unrotated columns, the last one masked)."""
    for dtype in (torch.float32, torch.bfloat16):
        outs = []
        for split in (False, True):
            monkeypatch.setitem(fused.CONFIG, "combine_split_d", split)
            outs.append(check(kind, pos, T, 16, head_dim, dtype, device, monkeypatch))
        assert torch.equal(outs[0], outs[1]), dtype


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
    """Every layer of a decode step (sliding, CSA, HCA) dispatches to the kernel; a prefill of 9 does not. Only
    dsv4.model.attention's dispatches take the kernels (the rest of the model its torch ops: on CPU the interpreter
    would run every kernel of the step)."""
    import types

    import dsv4
    from dsv4.model import attention as model_attention

    calls, kernel = [], fused.attention
    monkeypatch.setattr(fused, "attention", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    monkeypatch.setattr(model_attention, "kernels", types.SimpleNamespace(use_triton=lambda *a, **k: True))
    model = dsv4.load("tiny", device=DEVICES[0], dtype=torch.float32)  # CPU only through the interpreter
    state = model.new_state(32)
    model.prefill(state, list(range(1, 10)))
    assert not calls
    model.decode(state, 10)
    assert len(calls) == model.cfg.num_hidden_layers


# ---- the combine inside the split launch (CONFIG fused_combine) -------------------------------------------
def launched(monkeypatch) -> list:
    """The names of the attention kernels launched, in order."""
    names, real = [], fused.launcher

    def counted(fn, t):
        names.append(fn.__name__)
        return real(fn, t)
    monkeypatch.setattr(fused, "launcher", counted)
    return names


def two_launches(args, extra):
    saved = fused.CONFIG["fused_combine"]
    fused.CONFIG["fused_combine"] = False
    try:
        return fused.attention(*args, **extra)
    finally:
        fused.CONFIG["fused_combine"] = saved


# A window of 72 rows and keys in tiles of 16: 5 to 7 splits of each kind (a power of two or not); heads in
# blocks of 16 (20 heads: two tickets a query, the second block masked).
WIDE = dict(window=72, capacity=256)
FUSED_POSITIONS = [(SLIDING, 100, 3), (CSA, 200, 2), (HCA, 200, 1), (HCA, 60, 8)]


@pytest.fixture
def fused_combine(monkeypatch):
    for key, value in {"fused_combine": True, "block_n": 16, "block_h": 16}.items():
        monkeypatch.setitem(fused.CONFIG, key, value)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("heads,head_dim", [(2, 32), (20, 64)])
@pytest.mark.parametrize("kind,pos,T", FUSED_POSITIONS)
def test_fused_combine(monkeypatch, fused_combine, device, heads, head_dim, kind, pos, T):
    """One launch: the reference's tolerance; against the two launches equal bits under the interpreter (numpy
    sums the splits in order both ways), on a GPU within fp32 rounding (the combine kernel's sums over the splits
    associate as its tile layout does, the merge's in split order); the tickets back at 0."""
    names = launched(monkeypatch)
    got = check(kind, pos, T, heads, head_dim, torch.float32, device, monkeypatch, **WIDE)
    assert names == ["_attn_split_kernel"]
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    ref = two_launches(*case(kind, pos, T, heads, head_dim, torch.float32, device, **WIDE))
    if device == "cpu":
        assert torch.equal(got, ref)
    else:
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    assert not bool(qgemv.tickets_for(1, torch.device(device)).any())


@pytest.mark.parametrize("device", DEVICES)
def test_fused_combine_bfloat16_and_merge_chunks(monkeypatch, fused_combine, device):
    """bf16 (p and the output rounded as the two launches do), and merge chunks of 4 (several chunks of the
    unrotated part and of the rope pairs)."""
    check(CSA, 200, 1, 16, 64, torch.bfloat16, device, monkeypatch, **WIDE)
    monkeypatch.setattr(fused, "MERGE_VALUES", 1)
    assert fused.merge_d(16, 7, 8) == 2
    check(HCA, 200, 2, 16, 64, torch.float32, device, monkeypatch, **WIDE)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_combine_keeps_two_launches_beyond_max_splits(monkeypatch, fused_combine, device):
    monkeypatch.setitem(fused.CONFIG, "fused_max_splits", 4)
    names = launched(monkeypatch)
    check(CSA, 200, 1, 16, 64, torch.float32, device, monkeypatch, **WIDE)
    assert names == ["_attn_split_kernel", "_attn_combine_kernel"]


@pytest.mark.parametrize("device", DEVICES)
def test_fused_combine_without_the_devices_tickets(monkeypatch, fused_combine, device):
    """A capture before any eager launch finds no tickets (qgemv.tickets_for None): a zeroed buffer of its own,
    the same launch and bits; deterministic and without a host sync."""
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    args, extra = case(HCA, 200, 2, 16, 64, torch.float32, device, **WIDE)
    shared = fused.attention(*args, **extra)
    with NoHostSync():
        again = fused.attention(*args, **extra)
    monkeypatch.setattr(qgemv, "tickets_for", lambda count, device: None)
    assert torch.equal(shared, again) and torch.equal(shared, fused.attention(*args, **extra))


@pytest.mark.parametrize("device", DEVICES)
def test_fused_combine_pooled_rows_are_plain_rows(monkeypatch, fused_combine, device):
    """The pooled variant merges each row as the plain kernel merges that row alone, bit for bit."""
    g = torch.Generator().manual_seed(4)
    B, slots, heads, hd, half, W, NS = 3, 4, 20, 64, 8, 40, 50

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device)

    def on(*shape, p):
        return (torch.rand(*shape, generator=g) < p).to(device)

    ids = torch.tensor([2, 0, 3], device=device)
    args = (rand(B, heads, hd), rand(slots, W, hd), rand(B, hd), on(B, W + 1, p=0.7), rand(heads), rand(B, half),
            rand(B, half))
    extra = dict(comp=rand(slots, NS, hd), new=rand(B, 1, hd), committed=on(B, NS, p=0.5), new_visible=on(B, 1, p=0.5))
    names = launched(monkeypatch)
    got = fused.attention(*args, **extra, ids=ids)
    assert names == ["_attn_split_kernel"]
    q, win, kv, visible, sink, cos, sin = args
    for b in range(B):
        s = int(ids[b])
        alone = fused.attention(q[b:b + 1], win[s], kv[b:b + 1], visible[b:b + 1], sink, cos[b:b + 1], sin[b:b + 1],
                                comp=extra["comp"][s], new=extra["new"][b], committed=extra["committed"][b],
                                new_visible=extra["new_visible"][b:b + 1])
        assert torch.equal(got[b:b + 1], alone), b
