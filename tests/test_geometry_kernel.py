"""The step geometry kernels (dsv4.kernels.geometry) against the torch of model.step (Step, PoolStep): every
field of the sliding window's and each rate's geometry, exactly (integers, masks, and the rope tables made
from the kernel's fp32 window starts), at positions around window closes and ring wraps."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dsv4 import kernels
from dsv4.config import preset
from dsv4.model import step as model_step
from dsv4.model.rope import Rope

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: Triton's interpreter
pytestmark = pytest.mark.skipif(not kernels._triton_available(), reason="needs triton")
ROPE = Rope(preset("tiny"), DEVICE)
W = 8


def _both(monkeypatch, make):
    """make() under the torch reference, then under the kernels."""
    out = []
    for fused in (False, True):
        monkeypatch.setattr(model_step, "_fused", lambda pos, T, fused=fused: fused)
        out.append(make())
    return out


RATES = ((4, 8, 10), (16, 16, 3), (128, 128, 9), (4, 8, 2000))  # (m, ring rows, store rows)


def _geometry(step):
    """The step's sliding window and each rate's windows, made now (the step caches them)."""
    return step.sliding(), [step.windows(*rate) for rate in RATES]


def _all_same(ref, got, where: str):
    (vis_a, slots_a), (vis_b, slots_b) = ref[0], got[0]
    assert torch.equal(vis_a, vis_b) and torch.equal(slots_a, slots_b), f"{where}: sliding"
    for rate, a, b in zip(RATES, ref[1], got[1]):
        _same(a, b, f"{where}, rate {rate}")


def _same(ref, got, where: str):
    for f in dataclasses.fields(model_step.Windows):
        a, b = getattr(ref, f.name), getattr(got, f.name)
        if a is None or b is None:
            assert a is None and b is None, f"{where}: {f.name}"
            continue
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), f"{where}: {f.name}\n{a}\n{b}"


@pytest.mark.parametrize("T", [1, 3, 8])
@pytest.mark.parametrize("active", [None, True, False])
def test_step_geometry_kernel_is_the_reference(monkeypatch, T, active):
    for p in (0, 1, 3, 4, 7, 15, 16, 30, 127, 128, 1000):
        pos = torch.tensor(p, device=DEVICE)
        act = None if active is None else torch.tensor(active, device=DEVICE)
        ref, got = _both(monkeypatch, lambda: _geometry(model_step.Step(pos, T, ROPE, W, act)))
        _all_same(ref, got, f"pos {p}, T {T}")


@pytest.mark.parametrize("T", [9, 16, 63, 128])
def test_chunk_geometry_kernels_are_the_reference(monkeypatch, T):
    """DSV4_GEOMETRY_CHUNKS: a prefill chunk's geometry (past the decode kernels' MAX_T, up to CHUNK_T tokens) from
    the chunk kernels, whose lengths are arguments: every field the reference's, at positions around window closes
    and ring wraps; `supported` takes such a chunk only with the switch on, and never past CHUNK_T."""
    from dsv4.kernels import geometry

    pos0 = torch.tensor(0, device=DEVICE)
    monkeypatch.setitem(geometry.CONFIG, "chunks", False)
    assert not geometry.supported(pos0, T)
    monkeypatch.setitem(geometry.CONFIG, "chunks", True)
    assert geometry.supported(pos0, T) and not geometry.supported(pos0, geometry.CHUNK_T + 1)
    for p in (0, 3, 4, 15, 16, 127, 128, 1000):
        pos = torch.tensor(p, device=DEVICE)
        ref, got = _both(monkeypatch, lambda: _geometry(model_step.Step(pos, T, ROPE, W)))
        _all_same(ref, got, f"pos {p}, T {T}")


def test_chunk_geometry_compiles_once_per_power_of_two(monkeypatch):
    """A server's prompts come in every length: the chunk kernels' constexprs (what Triton compiles a variant per)
    depend on a chunk's length only through its power of two, so the server's warm-up (one chunk per power of two,
    dsv4.serve.scheduler.warm_prefill) compiles every variant a prompt can take. The launches are recorded, not run
    (test_chunk_geometry_kernels_are_the_reference runs them)."""
    from dsv4.kernels import geometry

    seen: dict = {}

    def recording(kernel, _like):
        def at(grid):
            def launch(*args, **constexprs):
                seen.setdefault((kernel.__name__, constexprs["T_P2"]), set()).add(tuple(sorted(constexprs.items())))
            return launch
        return type("Launch", (), {"__getitem__": lambda self, grid: at(grid)})()

    monkeypatch.setattr(geometry, "launcher", recording)
    monkeypatch.setitem(geometry.CONFIG, "chunks", True)
    for T in range(geometry.MAX_T + 1, geometry.CHUNK_T + 1):
        for p in (0, 1, 3, 127):
            pos = torch.tensor(p)
            geometry.sliding(pos, T, 128)
            for m, R, _ in RATES:
                geometry.windows(pos, T, m, R, 64, (T + m - 2) // m + 1)
    by_kernel = {}
    for (name, t_p2), variants in seen.items():
        by_kernel.setdefault(name, set()).add(t_p2)
        rates = {dict(v).get("M") for v in variants}
        assert len(variants) == len(rates), f"{name} at T_P2 {t_p2}: {len(variants)} variants for rates {rates}"
    assert by_kernel == {"_sliding_chunk_kernel": {16, 32, 64, 128}, "_windows_chunk_kernel": {16, 32, 64, 128}}


@pytest.mark.parametrize("active", [None, [True, False, True, True]])
def test_pooled_geometry_kernel_is_the_reference(monkeypatch, active):
    pos = torch.tensor([0, 15, 3, 129], device=DEVICE)
    ids = torch.tensor([2, 0, 5, 3], device=DEVICE)
    act = None if active is None else torch.tensor(active, device=DEVICE)
    ref, got = _both(monkeypatch, lambda: _geometry(model_step.PoolStep(pos, ids, ROPE, W, act)))
    _all_same(ref, got, "pooled")
