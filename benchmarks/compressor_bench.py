"""The compressor and the lightning indexer of one decode token (T=1) at Flash shapes: the torch
reference against the fused kernels (dsv4.kernels.compressor), per call.

Calls, each as one layer makes it: `csa` (CSA compressor, rate 4, overlapping, head_dim 512),
`csa_indexer` (the indexer's compressor, index_head_dim 128), `hca` (HCA compressor, rate 128) and
`index_topk` (64 heads x 128 against the committed rows and the new window, top 512), at committed
store sizes of 1k and 32k rows. Weights are dense bf16 (the linears are the same in every arm).
Arms: `torch` (the reference everywhere), `auto` (the reference with the kernels already checked on
a GPU: today's default), `triton` (the new kernels). Each figure is the median microseconds per
call over CUDA events: `graph_us` replays 50 calls captured in one CUDA graph (as decode runs),
`eager_us` times single eager calls. Every `triton` record states its agreement with `torch`:
entries max abs error, selection equal (indices and order) or how many positions differ (scores
of random inputs can tie within rounding; exact ties are tested in tests/test_compressor_kernel.py).

    python benchmarks/compressor_bench.py            # one GPU, JSON lines prefixed COMPRESSOR / COMPRESSOR_TOKEN
    TRITON_INTERPRET=1 python benchmarks/compressor_bench.py --count   # CPU: ops per call and per token

--count runs on CPU (Triton's interpreter for the kernels) and counts, under a TorchDispatchMode,
the aten ops that do work (views and allocations left out) plus the Triton launches of each call;
on a GPU some aten ops launch more than one kernel (sort, topk), so the torch figures are lower bounds.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dsv4.config import CSA, HCA, preset
from dsv4.model.compressor import compress, index_topk
from dsv4.model.rope import Rope
from dsv4.model.step import Step
from dsv4.formats import QWeight
from dsv4.receipts import emit

ARMS = ("torch", "auto", "triton")
CALLS = ("csa", "csa_indexer", "hca", "index_topk")




def layer(cfg, committed: int, device, dtype, seed: int = 0):
    """Inputs of one CSA and one HCA layer at the decode position after `committed` CSA windows."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    rnd = lambda *s, scale=1.0, dt=dtype: (torch.randn(*s, generator=g) * scale).to(device=device, dtype=dt)  # noqa
    D, hd, dI, H = cfg.hidden_size, cfg.head_dim, cfg.index_head_dim, cfg.index_n_heads
    m_c, m_h = cfg.compress_rates[CSA], cfg.compress_rates[HCA]
    pos = m_c * committed + 1
    capacity = pos + 64
    rows_c, rows_h = capacity // m_c + 2, capacity // m_h + 2

    def compressor(m, width, dim):
        return {"wkv": QWeight(rnd(width, D, scale=D ** -0.5)), "wgate": QWeight(rnd(width, D, scale=D ** -0.5)),
                "ape": rnd(m, width, dt=torch.float32), "norm": (torch.rand(dim, generator=g) + 0.5).to(device)}

    indexer = compressor(m_c, 2 * dI, dI)
    indexer["wq_b"] = QWeight(rnd(H * dI, cfg.q_lora_rank, scale=cfg.q_lora_rank ** -0.5))
    indexer["weights_proj"] = QWeight(rnd(H, D, scale=D ** -0.5))
    step = Step(torch.tensor(pos, device=device), 1, Rope(cfg, device), cfg.sliding_window)
    return {
        "x": rnd(1, D), "q_res": rnd(1, cfg.q_lora_rank), "step": step, "cos_sin": step.cos_sin("compress"),
        "csa": (compressor(m_c, 2 * hd, hd), rnd(2 * m_c, 2 * hd), rnd(2 * m_c, 2 * hd), rnd(rows_c, hd)),
        "csa_indexer": (indexer, rnd(2 * m_c, 2 * dI), rnd(2 * m_c, 2 * dI), rnd(rows_c, dI)),
        "hca": (compressor(m_h, hd, hd), rnd(m_h, hd), rnd(m_h, hd), rnd(rows_h, hd)),
        "win_c": step.windows(m_c, 2 * m_c, rows_c), "win_h": step.windows(m_h, m_h, rows_h),
    }


def calls(cfg, L, eps: float = 1e-6):
    """(name -> fn() for the four calls of one decode token's layer pair, the indexer's inputs)."""
    x = L["x"]

    def comp(name, win, overlap):
        w, ring_kv, ring_gate, store = L[name]
        return lambda: compress(x, w, ring_kv, ring_gate, store, win, overlap, eps, [])

    inew = comp("csa_indexer", L["win_c"], True)()
    cos, sin = L["cos_sin"]
    w_i, _, _, icomp = L["csa_indexer"]
    fns = {
        "csa": comp("csa", L["win_c"], True),
        "csa_indexer": comp("csa_indexer", L["win_c"], True),
        "hca": comp("hca", L["win_h"], False),
        "index_topk": lambda: index_topk(L["q_res"], x, cos, sin, w_i, icomp, inew, L["win_c"], cfg.index_topk,
                                         cfg.index_n_heads, cfg.index_head_dim),
    }
    return fns, {"index": (w_i, icomp, inew, L["win_c"]), "q": (L["q_res"], x, L["cos_sin"])}


def per_token(cfg, per_call: dict) -> float:
    """One decode token: each CSA layer makes csa + csa_indexer + index_topk, each HCA layer hca."""
    n_csa, n_hca = cfg.layer_types.count(CSA), cfg.layer_types.count(HCA)
    return n_csa * (per_call["csa"] + per_call["csa_indexer"] + per_call["index_topk"]) + n_hca * per_call["hca"]


def graph_us(fn, calls_: int = 50, reps: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls_):
            fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / calls_)
    return statistics.median(times)


def eager_us(fn, reps: int = 30) -> float:
    fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    return statistics.median(times)


def agreement(name: str, ref, got) -> dict:
    if name != "index_topk":
        return {"max_abs_err": float((got.float() - ref.float()).abs().max())}
    (rs, rv), (gs, gv) = ref, got
    return {"selection_equal": bool(torch.equal(rs, gs) and torch.equal(rv, gv)),
            "positions_differing": int((rs != gs).sum()),
            "set_equal": bool(torch.equal(rs.sort(-1).values, gs.sort(-1).values))}


def timing(cfg):
    for committed in (1024, 32768):
        L, inputs = calls(cfg, layer(cfg, committed, "cuda", torch.bfloat16))
        totals = {}
        for arm in ARMS:
            os.environ["DSV4_KERNELS"] = arm
            per_call = {}
            for name, fn in L.items():
                rec = {"call": name, "committed": committed, "arm": arm}
                if arm == "triton":
                    os.environ["DSV4_KERNELS"] = "torch"
                    ref = fn()
                    os.environ["DSV4_KERNELS"] = arm
                    rec.update(agreement(name, ref, fn()))
                per_call[name] = graph_us(fn)
                emit("COMPRESSOR", **rec, graph_us=round(per_call[name], 2), eager_us=round(eager_us(fn), 2))
            totals[arm] = per_token(cfg, per_call)
            emit("COMPRESSOR_TOKEN", arm=arm, committed=committed, graph_us=round(totals[arm], 1),
                 scope="per decode token: CSA layers x (csa + csa_indexer + index_topk) + HCA layers x hca")
        emit("COMPRESSOR_SPEEDUP", committed=committed, torch_over_triton=round(totals["torch"] / totals["triton"], 2),
             auto_over_triton=round(totals["auto"] / totals["triton"], 2))
        selection_parts(cfg, inputs, committed)


def selection_parts(cfg, inputs: dict, committed: int):
    """Where index_topk's time goes on the kernel path: the scores kernel, then torch.topk on its keys;
    beside them the reference's stable sort of fp32 scores of the same length."""
    from dsv4.kernels import compressor as fused

    w, icomp, inew, win = inputs["index"]
    q_res, x, (cos, sin) = inputs["q"]
    H, dI = cfg.index_n_heads, cfg.index_head_dim
    q = torch.nn.functional.linear(q_res, w["wq_b"].data).view(1, H, dI)
    weights = torch.nn.functional.linear(x, w["weights_proj"].data)
    keys = fused.index_keys(q, weights, cos, sin, icomp, inew, win.committed, win.visible)
    scores = torch.randn(keys.shape, device=keys.device)
    parts = {"index_keys_kernel": lambda: fused.index_keys(q, weights, cos, sin, icomp, inew, win.committed,
                                                           win.visible),
             "topk_on_keys": lambda: fused.topk(keys, min(cfg.index_topk, keys.shape[-1])),
             "stable_sort_fp32": lambda: torch.sort(scores, dim=-1, descending=True, stable=True)}
    for name, fn in parts.items():
        emit("COMPRESSOR_PART", part=name, committed=committed, entries=keys.shape[-1], graph_us=round(graph_us(fn), 2))


# Ops that launch nothing: views, metadata and allocations.
FREE = {"view", "_unsafe_view", "reshape", "expand", "unsqueeze", "squeeze", "slice", "select", "t", "transpose",
        "permute", "as_strided", "detach", "alias", "empty", "empty_like", "empty_strided", "lift_fresh", "split",
        "unbind", "_reshape_alias", "new_empty", "resolve_conj", "resolve_neg", "view_as", "expand_as"}


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()
        self.paused = False  # while Triton's interpreter runs a kernel (its own tensor copies are not ops)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        if name not in FREE and not self.paused:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def count(cfg):
    """Ops per call and per token on CPU: aten ops that do work, plus Triton launches."""
    from dsv4.kernels import compressor as fused_mod

    launches = collections.Counter()
    original = fused_mod.launcher
    counter = OpCounter()

    def counting(fn, t):
        kernel = original(fn, t)

        class Launch:
            def __getitem__(self, grid):
                def run(*args, **kw):
                    launches[fn.__name__] += 1
                    counter.paused = True
                    try:
                        return kernel[grid](*args, **kw)
                    finally:
                        counter.paused = False
                return run
        return Launch()

    fused_mod.launcher = counting
    L, _ = calls(cfg, layer(cfg, 256, "cpu", torch.float32))
    for arm in ("torch", "triton"):
        os.environ["DSV4_KERNELS"] = arm
        per_call = {}
        for name, fn in L.items():
            launches.clear()
            counter.ops.clear()
            with counter:
                fn()
            per_call[name] = sum(counter.ops.values()) + sum(launches.values())
            emit("COMPRESSOR_OPS", call=name, arm=arm, ops=per_call[name], aten=dict(counter.ops),
                 triton=dict(launches))
        emit("COMPRESSOR_OPS_TOKEN", arm=arm, ops=per_token(cfg, per_call),
             scope="per decode token, flash layer types; aten ops that do work + Triton launches")
    fused_mod.launcher = original


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", action="store_true", help="count ops on CPU instead of timing on a GPU")
    args = ap.parse_args()
    cfg = preset("flash")
    if args.count:
        count(cfg)
    else:
        emit("DEVICE", name=torch.cuda.get_device_name(), torch=torch.__version__)
        timing(cfg)


if __name__ == "__main__":
    main()
