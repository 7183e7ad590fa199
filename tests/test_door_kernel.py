"""The door's pack kernel (dsv4.kernels.door) against the reference door (census add + cat)."""

from __future__ import annotations

import pytest
import torch

from dsv4 import kernels
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
