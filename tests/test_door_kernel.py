"""The door's pack kernel (dsv4.kernels.door) against the reference door (census add + cat)."""

from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4 import kernels
from dsv4.kernels import door
from dsv4.parallel import Comm

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: Triton's interpreter


@pytest.mark.skipif(not kernels._triton_available(), reason="needs triton")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 64), (3, 2500)])
@pytest.mark.parametrize("armed", [(2, "moe"), (3, "moe"), (0, "attention")])  # the last door's flag: end_step's
def test_door_pack_matches_reference(monkeypatch, dtype, shape, armed):
    x = torch.randn(*shape).to(dtype).to(DEVICE)
    results = {}
    for mode in ("torch", "triton"):
        monkeypatch.setenv("DSV4_KERNELS", mode)
        comm = Comm(4, DEVICE)
        comm.arm_refusal(armed[0], 0, 7, armed[1])
        comm.begin_step()
        outs = [comm.all_reduce(x, layer, site) for layer in range(4) for site in ("attention", "moe")]
        comm.end_step()
        results[mode] = outs, comm.census.clone(), comm.verdict.clone(), comm.word.clone(), comm.fired.clone()
    (a, ca, va, wa, fa), (b, cb, vb, wb, fb) = results["torch"], results["triton"]
    assert all(torch.equal(p, q) and p.dtype == q.dtype for p, q in zip(a, b))
    assert torch.equal(ca, cb) and int(cb.sum()) == 8
    assert float(va) == float(vb) == 1.0
    assert torch.equal(wa, wb) and torch.equal(fa, fb)
    assert fb.tolist() == [7, armed[0], ("attention", "moe").index(armed[1])]


@pytest.mark.skipif(not kernels._triton_available(), reason="needs triton")
def test_door_verdict_counts_every_refusal_across_paths(monkeypatch):
    """Doors of both paths in one step (a non-contiguous x takes the reference door): the verdict holds every
    door's flag once, the last packed door's added by end_step."""
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    comm = Comm(3, DEVICE)
    for layer, site in ((0, "moe"), (1, "attention"), (2, "moe")):
        comm.arm_refusal(layer, 0, 5, site)
    comm.begin_step()
    x = torch.randn(4, 6, device=DEVICE)
    for layer in range(3):
        comm.all_reduce(x, layer, "attention")
        comm.all_reduce(x.t() if layer == 1 else x, layer, "moe")
    comm.end_step()
    assert float(comm.verdict) == 3.0 and int(comm.census.sum()) == 6


# ---- doors opened in place (door.CONFIG["in_place"]): the boundary kernel's bookkeeping, no pack ----------------

DOORS = [(layer, site) for layer in range(4) for site in ("attention", "moe")]


def boundary_weights(D, hc_mult=4):
    g = torch.Generator().manual_seed(D)
    n = (2 + hc_mult) * hc_mult
    return ((torch.randn(n, hc_mult * D, generator=g) * 0.05).to(DEVICE), (torch.randn(n, generator=g) * 0.1).to(DEVICE),
            torch.rand(3, generator=g).to(DEVICE), (torch.rand(D, generator=g) + 0.5).to(DEVICE))


def doors_step(comm, xs, in_place: bool):
    """One step's doors as the forward runs them: each opened by a first-boundary kernel on the previous door's
    output (the kernel does its bookkeeping; None where the pack runs), its partial sum xs[i] written into the
    payload (in_place) or handed over from elsewhere -> (reduced outputs, doors opened)."""
    from dsv4.kernels import hc_boundary

    fn, base, scale, norm_w = boundary_weights(xs[0].shape[1])
    prev, outs, opened = xs[-1], [], 0
    comm.begin_step()
    for (layer, site), x in zip(DOORS, xs):
        door_ = comm.open_door(layer, site, prev)
        if door_ is not None:
            hc_boundary.boundary(prev, None, None, None, fn, base, scale, norm_w, 4, 3, 1e-6, 1e-6, door_)
            opened += 1
        dest = comm.payload(layer, site, x.dtype)
        if dest is not None and in_place:
            x = dest.copy_(x)
        prev = comm.all_reduce(x, layer, site)
        outs.append(prev.clone())
    comm.end_step()
    return outs, opened


@pytest.mark.skipif(not kernels._triton_available(), reason="needs triton")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("in_place", [True, False], ids=["written_in_place", "copied_in"])
@pytest.mark.parametrize("armed", [(2, "moe"), (3, "moe"), (0, "attention")])  # the last door's flag: end_step's
def test_doors_in_place_match_reference(monkeypatch, dtype, in_place, armed):
    """Doors opened by the boundary kernel give the reference door's outputs, census, verdict, word and fired,
    with no pack launch; the partial sum written into the payload by its producer or copied in by the door."""
    monkeypatch.setitem(door.CONFIG, "in_place", True)
    xs = [torch.randn(2, 64).to(dtype).to(DEVICE) for _ in DOORS]
    results = {}
    for mode in ("torch", "triton"):
        monkeypatch.setenv("DSV4_KERNELS", mode)
        monkeypatch.setattr(door, "pack", None if mode == "triton" else door.pack)  # in place: never called
        comm = Comm(4, DEVICE)
        comm.arm_refusal(armed[0], 0, 7, armed[1])
        outs, opened = doors_step(comm, xs, in_place)
        assert opened == (len(DOORS) if mode == "triton" else 0)
        results[mode] = outs, comm.census.clone(), comm.verdict.clone(), comm.word.clone(), comm.fired.clone()
    (a, ca, va, wa, fa), (b, cb, vb, wb, fb) = results["torch"], results["triton"]
    assert all(torch.equal(p, q) and p.dtype == q.dtype for p, q in zip(a, b))
    assert torch.equal(ca, cb) and int(cb.sum()) == 8
    assert float(va) == float(vb) == 1.0
    assert torch.equal(wa, wb) and torch.equal(fa, fb)


@pytest.mark.skipif(not kernels._triton_available(), reason="needs triton")
def test_door_in_place_is_off_by_default_and_checks_its_door(monkeypatch):
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    x = torch.randn(2, 64, device=DEVICE)
    comm = Comm(2, DEVICE)
    comm.begin_step()
    if not door.CONFIG["in_place"]:  # DSV4_DOOR_IN_PLACE unset
        assert comm.open_door(0, "attention", x) is None and comm.payload(0, "attention", x.dtype) is None
    monkeypatch.setitem(door.CONFIG, "in_place", True)
    opened = comm.open_door(0, "attention", x)
    assert opened.payload.numel() == x.numel() + 1 and comm.payload(0, "moe", x.dtype) is None
    assert comm.payload(0, "attention", torch.bfloat16) is None  # a payload of another dtype: the door copies
    with pytest.raises(RuntimeError, match=r"door \(0, moe\) of 128 elements reached while door \(0, attention\)"):
        comm.all_reduce(x, 0, "moe")


# ---- through the model: every byte equal with the switch on and off ---------------------------------------------

SP = dsv4.SamplingParams(temperature=0.8, top_p=0.9, seed=5)
OPEN_DOOR = Comm.open_door


def model_run(source, in_place: bool, monkeypatch):
    """A prefill (a short chunk: fused boundaries), a solo step, a pooled step of 2 rows and a refused pooled step,
    with DSV4_KERNELS=triton -> every byte the steps leave, and whether every door of a step opened in place."""
    monkeypatch.setitem(door.CONFIG, "in_place", in_place)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    model = dsv4.load(source, device=DEVICE, dtype=torch.float32)
    opened = []
    monkeypatch.setattr(Comm, "open_door", lambda self, *a: opened.append(OPEN_DOOR(self, *a)) or opened[-1])
    model.pool_states(3)
    states = [model.new_state(24) for _ in range(2)]
    for b, s in enumerate(states):
        model.prefill(s, [3 + b, 1, 4, 1, 5][:4 + b])
    tokens = [model.step(states[0], 9, SP), *model.step_batch(states, [7, 2], [SP, SP])]
    model.arm_refusal(1, 0, 77, "moe")
    with pytest.raises(dsv4.RefusalError, match="rank 0 layer 1 site moe word 77"):
        model.step_batch(states, [4, 6], [SP, SP])
    comm = model.transformer.comm
    record = (tokens, [model.digests(s) for s in states], [s.logits.clone() for s in states], comm.census.clone(),
              float(comm.verdict), model.refusal_words(), comm.fired.clone())
    return record, opened


@pytest.mark.skipif(DEVICE == "cpu" and not kernels.interpreting(),
                    reason="CPU tensors under DSV4_KERNELS=triton need the interpreter")
# ~50 s (none) and ~2 min (fp8) on CPU: the slow set there (doors open in place by default, so every other model
# test runs them)
@pytest.mark.parametrize("quant", [pytest.param(q, marks=[pytest.mark.slow] if DEVICE == "cpu" else [])
                                   for q in ("none", "fp8")])
def test_model_bytes_equal_with_doors_in_place(monkeypatch, tmp_path, quant):
    from dsv4.checkpoint.synth import synth
    from dsv4.config import preset

    ckpt = synth(preset("tiny"), tmp_path / "tiny", seed=3, quant=quant)
    off, none_opened = model_run(ckpt, False, monkeypatch)
    on, opened = model_run(ckpt, True, monkeypatch)
    assert not any(none_opened) and opened and all(d is not None for d in opened)
    L = preset("tiny").num_hidden_layers
    assert len(opened) == 2 * L * 5  # every door of 2 prefills and 3 steps (the refused one's too)
    (t0, d0, l0, c0, v0, w0, f0), (t1, d1, l1, c1, v1, w1, f1) = off, on
    assert t0 == t1 and d0 == d1 and all(torch.equal(a, b) for a, b in zip(l0, l1))
    assert torch.equal(c0, c1) and int(c1.sum()) == 2 * L * 5 and v0 == v1 == 1.0
    assert w0 == w1 == [77] and torch.equal(f0, f1)


def ranks_run(ckpt, in_place: bool, monkeypatch):
    """Two gloo ranks (rank 1 spawned: the switch reaches it by DSV4_DOOR_IN_PLACE) with DSV4_KERNELS=triton: a
    prefill, two steps and a step refused by rank 1 -> tokens, both ranks' bytes, census and words. The caller runs
    rank 0 on Triton's own interpreter (conftest's stock_interpreter), as rank 1's."""
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    monkeypatch.setenv("DSV4_DOOR_IN_PLACE", "1" if in_place else "0")
    monkeypatch.setitem(door.CONFIG, "in_place", in_place)
    with dsv4.load(ckpt, device="cpu", dtype=torch.float32, ranks=2) as two:
        state = two.new_state(16)
        two.prefill(state, [3, 1, 4, 1])
        tokens = [two.step(state, 5, SP)]
        tokens.append(two.step(state, tokens[-1], SP))
        two.arm_refusal(1, 1, 55, "attention")
        with pytest.raises(dsv4.RefusalError, match="rank 1 layer 1 site attention word 55"):
            two.step(state, tokens[-1], SP)
        return tokens, two.digests_all(state), two.logits_sha_all(state), two.census_all(), two.refusal_words()


@pytest.mark.slow
@pytest.mark.skipif(not kernels.interpreting(), reason="gloo ranks on CPU through the kernels: the interpreter")
def test_two_ranks_bytes_equal_with_doors_in_place(monkeypatch, tmp_path, stock_interpreter):
    from dsv4.checkpoint.synth import synth
    from dsv4.config import preset

    ckpt = synth(preset("tiny"), tmp_path / "tiny", seed=3, quant="fp8")
    off = ranks_run(ckpt, False, monkeypatch)
    opened = []
    monkeypatch.setattr(Comm, "open_door", lambda self, *a: opened.append(OPEN_DOOR(self, *a)) or opened[-1])
    on = ranks_run(ckpt, True, monkeypatch)
    assert on == off
    assert len(opened) == 2 * preset("tiny").num_hidden_layers * 4 and all(d is not None for d in opened)  # rank 0
    assert on[4] == [0, 55] and len(set(on[1])) == 1
