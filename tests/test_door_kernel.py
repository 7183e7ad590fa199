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
def test_door_pack_matches_reference(monkeypatch, dtype, shape):
    x = torch.randn(*shape).to(dtype).to(DEVICE)
    results = {}
    for mode in ("torch", "triton"):
        monkeypatch.setenv("DSV4_KERNELS", mode)
        comm = Comm(4, DEVICE)
        comm.arm_refusal(2, 0, 7, "moe")
        comm.begin_step()
        outs = [comm.all_reduce(x, layer, site) for layer in range(4) for site in ("attention", "moe")]
        comm.end_step()
        results[mode] = outs, comm.census.clone(), comm.verdict.clone(), comm.word.clone(), comm.fired.clone()
    (a, ca, va, wa, fa), (b, cb, vb, wb, fb) = results["torch"], results["triton"]
    assert all(torch.equal(p, q) and p.dtype == q.dtype for p, q in zip(a, b))
    assert torch.equal(ca, cb) and int(cb.sum()) == 8
    assert float(va) == float(vb) == 1.0
    assert torch.equal(wa, wb) and torch.equal(fa, fb) and fb.tolist() == [7, 2, 1]
