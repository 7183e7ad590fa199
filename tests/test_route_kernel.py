"""The fused MoE router (dsv4.kernels.route) against its torch reference (dsv4.model.moe.route).

CPU tensors run through Triton's interpreter (conftest). The kernel rounds where the reference's ops
round; its softplus is log(1 + exp(x)) rather than torch's log1p, so scores may differ in the last
fp32 bit: ids must match exactly (inputs keep the k-th and (k+1)-th scores apart), weights within
2 ulp of their dtype.
"""

from __future__ import annotations

import pytest
import torch

from dsv4 import kernels
from dsv4.config import preset
from dsv4.kernels import route as fused
from dsv4.model import moe

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: Triton's interpreter


def _inputs(T, E, k, dtype, hashed, seed):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(T, E, generator=g) * 3).to(dtype)
    bias = torch.randn(E, generator=g) * 0.1
    tokens = torch.randint(0, 1000, (T,), generator=g)
    tid2eid = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(1000)]) if hashed else None
    to = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
    return to(logits), to(bias), to(tokens), to(tid2eid)


def _reference(logits, bias, tokens, tid2eid, cfg):
    w = {"tid2eid": tid2eid} if tid2eid is not None else {"bias": bias}
    # the reference from the logits on: moe.route with an identity gate
    ident = torch.eye(logits.shape[1], dtype=logits.dtype, device=logits.device)
    from dsv4.formats import QWeight

    w["gate"] = QWeight(ident)
    return moe.route(logits, tokens, w, cfg)


@pytest.mark.skipif(not kernels._triton_available(), reason="needs triton")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hashed", [False, True], ids=["topk", "hash"])
@pytest.mark.parametrize("T", [1, 5])
@pytest.mark.parametrize("warps", [1, 4])
def test_route_kernel_matches_reference(monkeypatch, dtype, hashed, T, warps):
    """CONFIG num_warps 1 and 4 (the interpreter ignores warps: a GPU's layouts differ)."""
    monkeypatch.setitem(fused.CONFIG, "num_warps", warps)
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    cfg = preset("flash")  # route() reads k, scoring_func, norm_topk_prob, routed_scaling_factor
    E, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    for seed in range(4):
        logits, bias, tokens, tid2eid = _inputs(T, E, k, dtype, hashed, seed)
        ref_ids, ref_w = _reference(logits, bias, tokens, tid2eid, cfg)
        ids, w = fused.route(logits, tokens, bias, tid2eid, k, cfg.norm_topk_prob, cfg.routed_scaling_factor)
        assert torch.equal(ids, ref_ids), (seed, ids, ref_ids)
        assert w.dtype == ref_w.dtype
        ulp = torch.finfo(dtype).eps * ref_w.abs().max()
        assert float((w.float() - ref_w.float()).abs().max()) <= 2 * ulp, (seed, w, ref_w)


@pytest.mark.skipif(not kernels._triton_available(), reason="needs triton")
def test_route_kernel_ties_go_to_the_lowest_id():
    logits = torch.zeros(1, 32, device=DEVICE)
    logits[0, [3, 9, 17, 20, 25, 30, 31]] = 5.0  # seven equal best scores for six places
    ids, w = fused.route(logits, torch.zeros(1, dtype=torch.int64, device=DEVICE), torch.zeros(32, device=DEVICE),
                         None, 6, True, 1.0)
    assert ids.tolist() == [[3, 9, 17, 20, 25, 30]]
    assert abs(float(w.sum()) - 1.0) < 1e-6
