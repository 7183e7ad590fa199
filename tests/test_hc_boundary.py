"""The mHC boundary in one launch (dsv4.kernels.hc_boundary) against the launches it replaces.

Reference: hc_post -> hc_pre -> rms_norm of the torch reference (dsv4.model). Tolerances: fp32 within
1e-5 relative (tests/test_kernels.py's for mHC's maps: the norm is applied after the projection, and the
partials are summed over D-slices); in bf16 the new streams within hc_post's bound (the reference rounds
its two terms before adding them), and post, comb and the normed row within test_kernels' hc_pre bounds
from those streams. Whole model: the same greedy tokens, logits within 1e-5 of the largest. The finish's options
(CONFIG one_pass_finish, warp_maps) sum in other orders: the same bounds, the same row invariance.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import dsv4
from dsv4 import kernels
from dsv4.config import preset
from dsv4.kernels import door
from dsv4.kernels import hc_boundary as fused
from dsv4.kernels import qgemv
from dsv4.model import hc, norm

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CFG = preset("tiny")


def inputs(T, hc_mult, D, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    n = (2 + hc_mult) * hc_mult

    def rand(*shape, scale=1.0, shift=0.0):
        return (torch.randn(*shape, generator=g) * scale + shift).to(DEVICE)

    return dict(out=rand(T, D).to(dtype), post=2 * torch.rand(T, hc_mult, generator=g).to(DEVICE),
                comb=torch.softmax(rand(T, hc_mult, hc_mult), -1), h=rand(T, hc_mult, D).to(dtype),
                fn=rand(n, hc_mult * D, scale=0.05), base=rand(n, scale=0.1),
                scale=torch.rand(3, generator=g).to(DEVICE),
                norm_w=(torch.rand(D, generator=g) + 0.5).to(dtype).to(DEVICE))


# hc_boundary.CONFIG's finish options (off by default): each arm must meet the same bounds and row invariance.
OPTIONS = {"plain": {}, "one_pass": {"one_pass_finish": True}, "warp_maps": {"warp_maps": True},
           "both": {"one_pass_finish": True, "warp_maps": True}}


@pytest.fixture(params=list(OPTIONS))
def options(request, monkeypatch):
    for key, value in OPTIONS[request.param].items():
        monkeypatch.setitem(fused.CONFIG, key, value)
    return request.param


def fused_boundary(a, hc_mult, first=False):
    post, comb, h = (None, None, None) if first else (a["post"], a["comb"], a["h"])
    return fused.boundary(a["out"], post, comb, h, a["fn"], a["base"], a["scale"], a["norm_w"], hc_mult,
                          CFG.hc_sinkhorn_iters, CFG.rms_norm_eps, CFG.hc_eps)


def reference_pre(h, a, hc_mult, monkeypatch):
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    cfg = dataclasses.replace(CFG, hc_mult=hc_mult)
    post, comb, collapsed = hc.hc_pre(h, a["fn"], a["base"], a["scale"], cfg)
    return post, comb, norm.rms_norm(collapsed, a["norm_w"], cfg.rms_norm_eps)


def reference(a, hc_mult, monkeypatch, first=False):
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    if first:
        h = a["out"].unsqueeze(1).expand(-1, hc_mult, -1).contiguous()
    else:
        h = hc.hc_post(a["out"], a["post"], a["comb"], a["h"])
    return (h, *reference_pre(h, a, hc_mult, monkeypatch))


@pytest.mark.parametrize("first", [False, True], ids=["boundary", "first"])
@pytest.mark.parametrize("T,hc_mult,D", [(1, 4, 64), (3, 4, 100), (2, 2, 300)])
def test_fp32_against_the_reference(monkeypatch, options, first, T, hc_mult, D):
    a = inputs(T, hc_mult, D, torch.float32, seed=T * D + first)
    got, ref = fused_boundary(a, hc_mult, first), reference(a, hc_mult, monkeypatch, first)
    for k, r, name in zip(got, ref, ("streams", "post", "comb", "normed")):
        assert k.dtype == r.dtype and k.shape == r.shape, name
        torch.testing.assert_close(k, r, rtol=1e-5, atol=1e-5, msg=name)
    # comb is doubly stochastic after Sinkhorn: the reducer ran all the iterations.
    torch.testing.assert_close(got[2].sum(-2), torch.ones(T, hc_mult, device=DEVICE), rtol=0, atol=1e-5)


@pytest.mark.parametrize("T,hc_mult,D", [(2, 4, 700), (1, 4, 4096)])
def test_bf16_against_the_reference(monkeypatch, options, T, hc_mult, D):
    a = inputs(T, hc_mult, D, torch.bfloat16, seed=D)
    new, post, comb, x = fused_boundary(a, hc_mult)
    ref_new = reference(a, hc_mult, monkeypatch)[0]
    # hc_post's bound (tests/test_kernels.py::test_hc_post): the reference rounds both terms first
    bound = (a["post"].unsqueeze(-1) * a["out"].float().unsqueeze(-2)).abs() + torch.einsum(
        "tjk,tjd->tkd", a["comb"], a["h"].float().abs())
    assert bool(((new.float() - ref_new.float()).abs() <= 2 ** -7 * bound + 1e-6).all())
    # from the same streams, hc_pre's and rms_norm's bounds (test_kernels: 1e-5 for the maps, a bf16 step)
    ref_post, ref_comb, ref_x = reference_pre(new, a, hc_mult, monkeypatch)
    torch.testing.assert_close(post, ref_post, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(comb, ref_comb, rtol=1e-5, atol=1e-5)
    assert x.dtype == torch.bfloat16
    torch.testing.assert_close(x.float(), ref_x.float(), rtol=2 ** -7, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_first_boundary_gathers_its_rows_from_the_table(options, dtype):
    """The first boundary given the embedding table and token ids (GATHER: no gather launch before it) computes
    what it computes on the gathered rows, bit for bit, every output."""
    a = inputs(3, 4, 300, dtype, seed=11)
    g = torch.Generator().manual_seed(12)
    table = torch.randn(50, 300, generator=g).to(dtype).to(DEVICE)
    ids = torch.tensor([7, 0, 49], device=DEVICE)
    args = (a["fn"], a["base"], a["scale"], a["norm_w"], 4, CFG.hc_sinkhorn_iters, CFG.rms_norm_eps, CFG.hc_eps)
    gathered = fused.boundary(table, None, None, None, *args, ids=ids)
    rows = fused.boundary(table.index_select(0, ids), None, None, None, *args)
    assert all(torch.equal(x, y) for x, y in zip(gathered, rows))
    with pytest.raises(ValueError, match="first boundary only"):
        fused.boundary(table, a["post"], a["comb"], a["h"], *args, ids=ids)


def test_streams_equal_hc_posts_kernel():
    """The new streams are hc_post.py's arithmetic: equal to its kernel's output, bit for bit."""
    from dsv4.kernels import hc_post

    a = inputs(3, 4, 300, torch.bfloat16, seed=2)
    assert torch.equal(fused_boundary(a, 4)[0], hc_post.hc_post(a["out"], a["post"], a["comb"], a["h"]))


def test_row_alone_equals_row_in_a_batch_and_runs_repeat(options):
    """Slices depend on (hc, D) alone: a row's bits do not depend on the rows beside it; two runs agree;
    the tickets are back at 0 after each launch."""
    a = inputs(3, 4, 300, torch.float32, seed=5)
    batch = fused_boundary(a, 4)
    again = fused_boundary(a, 4)
    assert all(torch.equal(x, y) for x, y in zip(batch, again))
    per_row = {"out", "post", "comb", "h"}
    for r in range(3):
        alone = fused_boundary({k: v[r:r + 1] if k in per_row else v for k, v in a.items()}, 4)
        assert all(torch.equal(x, y[r:r + 1]) for x, y in zip(alone, batch)), r
    assert not bool(qgemv.tickets_for(3, torch.device(DEVICE)).any())


@pytest.mark.parametrize("first", [False, True], ids=["boundary", "first"])
@pytest.mark.parametrize("wire", [torch.bfloat16, torch.float32])
def test_door_bookkeeping_leaves_the_boundary_alone(first, wire):
    """With a door (dsv4.parallel.Door) the launch also stores the door's flag after its payload, adds 1 to its
    census cell and the previous door's flag to the verdict (door.pack's bookkeeping, once per launch whatever
    the rows); the boundary's outputs are the bits it gives without one."""
    from dsv4.parallel import Door

    a = inputs(3, 4, 300, torch.bfloat16, seed=7)
    plain = fused_boundary(a, 4, first)
    payload = torch.full((3 * 300 + 1,), 5.0, dtype=wire, device=DEVICE)
    census = torch.tensor(4, device=DEVICE)
    verdict = torch.tensor(2.0, device=DEVICE)
    seen = None if first else torch.tensor(1.0, dtype=wire, device=DEVICE)
    door = Door(0, 1, payload, 3 * 300, torch.Size((3, 300)), torch.tensor(1.0, device=DEVICE), census, seen, verdict)
    post, comb, h = (None, None, None) if first else (a["post"], a["comb"], a["h"])
    got = fused.boundary(a["out"], post, comb, h, a["fn"], a["base"], a["scale"], a["norm_w"], 4, CFG.hc_sinkhorn_iters,
                         CFG.rms_norm_eps, CFG.hc_eps, door)
    assert all(torch.equal(x, y) for x, y in zip(got, plain))
    assert float(payload[-1]) == 1.0 and bool((payload[:-1] == 5.0).all())  # the flag; the partial sum's not touched
    assert int(census) == 5 and float(verdict) == (2.0 if first else 3.0)


@pytest.mark.skipif(DEVICE != "cuda", reason="CONFIG sinkhorn_rcp's inline PTX runs compiled only")
@pytest.mark.parametrize("first", [False, True], ids=["boundary", "first"])
def test_sinkhorn_rcp_keeps_the_bits(monkeypatch, first):
    """CONFIG sinkhorn_rcp (the finish's divisions by sums as rcp.approx.ftz and a rounded multiply: div.full's own
    instructions for a normal divisor, without its range checks) gives every output the default launch's bits, in bf16
    and fp32, 1 and 3 rows."""
    for dtype, T in ((torch.bfloat16, 1), (torch.float32, 3)):
        a = inputs(T, 4, 4096, dtype, seed=45 + T)
        plain = fused_boundary(a, 4, first)
        monkeypatch.setitem(fused.CONFIG, "sinkhorn_rcp", True)
        got = fused_boundary(a, 4, first)
        monkeypatch.setitem(fused.CONFIG, "sinkhorn_rcp", False)
        for x, y, name in zip(got, plain, ("streams", "post", "comb", "normed")):
            assert torch.equal(x, y), (name, dtype, T)


def test_one_pass_only_where_the_row_fits(monkeypatch):
    """one_pass_finish holds the row's hc streams in registers: Flash's (hc 4, D 4096) fits 8 warps, a wider row
    keeps the two passes."""
    monkeypatch.setitem(fused.CONFIG, "one_pass_finish", True)
    assert fused.one_pass(4, 4096) and not fused.one_pass(4, 8192)
    monkeypatch.setitem(fused.CONFIG, "one_pass_finish", False)
    assert not fused.one_pass(4, 4096)


def test_unsupported_shapes():
    a = inputs(1, 4, 64, torch.float32, seed=1)
    assert fused.supported(a["h"], 4, a["fn"], a["norm_w"])
    assert fused.supported(a["out"], 4, a["fn"], a["norm_w"])  # the first boundary: the embedded rows
    assert not fused.supported(a["h"], 4, a["fn"][:, :128], a["norm_w"])  # hc_fn of another width
    assert not fused.supported(a["h"].transpose(1, 2).contiguous().transpose(1, 2), 4, a["fn"], a["norm_w"])
    b = inputs(1, 3, 64, torch.float32, seed=1)
    assert not fused.supported(b["h"], 3, b["fn"], b["norm_w"])  # hc not a power of two


# ---- through the model -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    return dsv4.load("tiny", device=DEVICE, dtype=torch.float32)


def primed(model, monkeypatch):
    """A state after a 5-token prefill under the reference (prefill does not take the fused boundary)."""
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    state = model.new_state(16)
    model.prefill(state, [3, 1, 4, 1, 5])
    return state


def test_model_decode_against_the_reference(monkeypatch, tiny):
    """Two decode steps with every kernel (the boundary included) against the torch reference."""
    def run(mode):
        state = primed(tiny, monkeypatch)
        monkeypatch.setenv("DSV4_KERNELS", mode)
        logits = [tiny.decode(state, 9).reshape(-1)]
        logits.append(tiny.decode(state, int(logits[-1].argmax())).reshape(-1))
        return torch.stack(logits)

    ref, got = run("torch"), run("triton")
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
    err = float((got - ref).abs().max() / ref.abs().max())
    assert err <= 1e-5, err


def counting(monkeypatch) -> list:
    """Each Triton launch of any dsv4.kernels module appends its kernel's name."""
    import importlib
    import pkgutil

    names: list = []
    for m in pkgutil.iter_modules(kernels.__path__):
        module = importlib.import_module(f"dsv4.kernels.{m.name}")
        real = getattr(module, "launcher", None)
        if real is None:  # a module that launches through the others (pooled)
            continue

        def counted(fn, t, real=real):
            kernel = real(fn, t)

            class Launch:
                def __getitem__(self, grid):
                    names.append(fn.__name__)
                    return kernel[grid]
            return Launch()
        monkeypatch.setattr(module, "launcher", counted)
    return names


def test_decode_step_launches_fewer_kernels_without_host_sync(monkeypatch, tiny):
    """A decode step under NoHostSync (what a graph captures) with and without the fused boundary: each
    layer's two boundaries but the last (hc_post, the mix GEMV, hc_pre, rms_norm: 4 launches) and the first
    (3) become one launch each."""
    from dsv4.kernels import dense

    launched, steps = counting(monkeypatch), {}
    for arm, supported in (("unfused", lambda *a: False), ("fused", fused.supported)):
        state = primed(tiny, monkeypatch)
        monkeypatch.setenv("DSV4_KERNELS", "triton")
        monkeypatch.setattr(fused, "supported", supported)
        launched.clear()
        steps[arm] = (tiny.check_capturable(state, [9]), len(launched), launched.count("_boundary_kernel"))
    cfg = tiny.cfg
    layers = cfg.num_hidden_layers
    assert dense.tiling((2 + cfg.hc_mult) * cfg.hc_mult, cfg.hc_mult * cfg.hidden_size, torch.float32)[2] == 1
    assert steps["fused"][2] == 2 * layers and steps["unfused"][2] == 0
    # doors opened in place (kernels.door CONFIG in_place): the unfused boundaries leave each door's pack (2 a layer)
    packs = 2 * layers if door.CONFIG["in_place"] else 0
    assert steps["unfused"][1] - steps["fused"][1] == (2 * layers - 1) * 3 + 2 + packs
    assert steps["fused"][0] == steps["unfused"][0]  # the same token


def test_lean_prologue_changes_no_bit(monkeypatch, tiny):
    """bookkeeping.CONFIG lean_prologue (the step's position a view of pos, the embedding gathered by the first
    boundary): two decode steps' logits and the state's bytes are those without it, bit for bit."""
    from dsv4.kernels import bookkeeping

    def run(lean):
        monkeypatch.setitem(bookkeeping.CONFIG, "lean_prologue", lean)
        state = primed(tiny, monkeypatch)
        monkeypatch.setenv("DSV4_KERNELS", "triton")
        logits = [tiny.decode(state, 9).reshape(-1)]
        logits.append(tiny.decode(state, int(logits[-1].argmax())).reshape(-1))
        return torch.stack(logits), tiny.digests(state)

    (lean, lean_digest), (plain, plain_digest) = run(True), run(False)
    assert torch.equal(lean, plain) and lean_digest == plain_digest
