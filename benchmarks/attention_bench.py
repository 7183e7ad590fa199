"""Decode attention of one layer (dsv4.kernels.attention) against its torch reference, Flash shapes.

One GPU, T = 1 query of H = 32 heads (a rank of 2), head_dim 512, sliding window 128, at the last
position of the capacity (the ring full, every store row committed). Cases: sliding only; CSA with
512 indexer picks from a 128k-token store; HCA over a 4k and a 128k-token store (capacity // 128 + 2
rows). Random bf16 state; the masks are the real ones (step.Step).

For each case, correctness first: the largest error of the kernel (bf16) and of the reference run in
bf16, each against the reference in float32 on the same inputs, relative to the output's largest
magnitude. Then each arm's microseconds per call: "graph" is the median over 10 replays of 50 calls
captured in one CUDA graph (how the decode step runs), "eager" the median of 50 single calls timed
with CUDA events (launch overhead included). Bytes: what the call must read (q, the key rows it
attends to, masks and picks, the output written); the kernel also writes and rereads its fp32
per-split partials, counted apart. One ATTN record per (case, arm), kernel arms per launch config. Kernel
arms also record splits, fused (whether the combine ran inside the split launch) and default_bits (the
output equals kernel_default's bit for bit; the fused merge sums the splits in its own order: it may not).

--ops (CPU, no GPU needed): ATTN_OPS records, the aten ops each arm dispatches for one decode token of
each case, split into ops that launch a kernel on a GPU and those that do not (views, allocations),
plus the Triton launches (the kernels are not run: the launcher is replaced by a counter).
"""

from __future__ import annotations

import argparse
import collections
import statistics

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dsv4.config import CSA, HCA, SLIDING, preset
from dsv4.kernels import cdiv
from dsv4.kernels import attention as fused
from dsv4.model.attention import _attend
from dsv4.model.rope import Rope
from dsv4.model.step import Step
from dsv4.receipts import emit

HEADS = 32
CASES = [("sliding", SLIDING, 131072), ("csa_512_of_128k", CSA, 131072), ("hca_4k", HCA, 4096),
         ("hca_128k", HCA, 131072)]
CONFIGS = {
    "default": {},
    "n16_w4": {"block_n": 16, "num_warps": 4},
    "n16_t2_w4": {"block_n": 16, "tiles": 2, "num_warps": 4},
    "n64_h16_w8": {"block_n": 64, "block_h": 16, "num_warps": 8},
    "n32_t2_w8": {"block_n": 32, "tiles": 2, "num_warps": 8},
    # the combine in the split launch (CONFIG fused_combine): up to its default fused_max_splits (8; beyond it the
    # two launches), every case, and with 2 tiles a program (half the splits, so half the merge's bytes)
    "fused": {"fused_combine": True},
    "fused_any": {"fused_combine": True, "fused_max_splits": 64},
    "fused_any_t2": {"fused_combine": True, "fused_max_splits": 64, "tiles": 2},
}




def inputs(kind, capacity: int, device, dtype, T: int = 1, seed: int = 0):
    """(args, extra) of fused.attention / _attend: a random state at position capacity - T."""
    cfg = preset("flash")
    g = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device=device) * scale).to(dtype)

    hd, W = cfg.head_dim, cfg.sliding_window
    step = Step(torch.tensor(capacity - T, device=device), T, Rope(cfg, device), W)
    visible, _ = step.sliding()
    cos, sin = step.cos_sin("main" if kind == SLIDING else "compress")
    args = (rand(T, HEADS, hd, scale=3.0), rand(W, hd), rand(T, hd), visible,
            torch.randn(HEADS, generator=g, device=device), cos, sin)
    if kind == SLIDING:
        return args, {}
    m = cfg.compress_rate(next(i for i, t in enumerate(cfg.layer_types) if t == kind))
    rows = capacity // m + 2
    win = step.windows(m, 2 * m if kind == CSA else m, rows)
    comp, new = rand(rows, hd), rand(win.wids.shape[0], hd)
    if kind == HCA:
        return args, dict(comp=comp, new=new, committed=win.committed, new_visible=win.visible)
    scores = torch.randn(T, rows + new.shape[0], generator=g, device=device)
    scores = scores.masked_fill(~torch.cat([win.committed.expand(T, -1), win.visible], -1), float("-inf"))
    ordered, order = torch.sort(scores, dim=-1, descending=True, stable=True)
    k = cfg.index_topk
    return args, dict(comp=comp, new=new, sel=order[:, :k], valid=ordered[:, :k] > float("-inf"))


def bytes_read(args, extra) -> dict:
    """Bytes the call must move (host-side count from the masks; outside any timing)."""
    q, win, kv, visible = args[:4]
    row = q.shape[-1] * q.element_size()
    keys = int(visible.any(0).sum())  # the sliding rows some query sees
    masks = visible.numel()
    if "sel" in extra:
        keys += int(torch.unique(extra["sel"][extra["valid"]]).numel())
        masks += extra["sel"].numel() * 9
    elif "comp" in extra:
        keys += int(extra["committed"].sum()) + int(extra["new_visible"].any(0).sum())
        masks += extra["committed"].numel() + extra["new_visible"].numel()
    return {"bytes": 2 * q.numel() * q.element_size() + keys * row + masks, "key_rows": keys}


def partial_bytes(q, n_keys: int) -> int:
    c = fused.CONFIG
    T, H, hd = q.shape
    splits = cdiv(cdiv(n_keys, c["block_n"]), c["tiles"])
    return 2 * T * H * splits * (hd + 2) * 4


def timed_graph(fn, calls: int = 50, reps: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / calls)
    return statistics.median(times)


def timed_eager(fn, calls: int = 50) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(calls):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    return statistics.median(times)


def rel_err(got, ref) -> float:
    return float((got.float() - ref).abs().max() / ref.abs().max())


def n_keys(args, extra) -> int:
    T, W = args[0].shape[0], args[1].shape[0]
    if "sel" in extra:
        return W + T + extra["sel"].shape[-1]
    return W + T + (extra["comp"].shape[0] + extra["new"].shape[0] if extra else 0)


def bench(configs):
    for name, kind, capacity in CASES:
        args, extra = inputs(kind, capacity, "cuda", torch.bfloat16)
        up = [a.float() if a.is_floating_point() else a for a in args]
        ref32 = _attend(*up, **{k: v.float() if v.is_floating_point() else v for k, v in extra.items()})
        moved = bytes_read(args, extra)
        assert fused.supported(*args, **extra)
        arms = [("reference", {}, lambda: _attend(*args, **extra))] + [
            (f"kernel_{c}", CONFIGS[c], lambda: fused.attention(*args, **extra)) for c in configs]
        default = dict(fused.CONFIG)
        fused.CONFIG["fused_combine"] = False
        baseline = fused.attention(*args, **extra)  # kernel_default's output without DSV4_ATTN_FUSED_COMBINE
        fused.CONFIG.update(default)
        for arm, cfg, fn in arms:
            fused.CONFIG.update(cfg)
            first, second = fn(), fn()
            rec = dict(case=name, arm=arm, capacity=capacity, heads=HEADS, max_rel_err=rel_err(first, ref32),
                       deterministic=bool(torch.equal(first, second)), **moved)
            if arm != "reference":
                splits = cdiv(cdiv(n_keys(args, extra), fused.CONFIG["block_n"]), fused.CONFIG["tiles"])
                rec.update(splits=splits, default_bits=bool(torch.equal(first, baseline)),
                           fused=fused.CONFIG["fused_combine"] and splits <= fused.CONFIG["fused_max_splits"])
            rec["us_graph"] = timed_graph(fn)
            rec["us_eager"] = timed_eager(fn)
            rec["gbps_graph"] = moved["bytes"] / rec["us_graph"] / 1e3
            if arm != "reference":
                rec["partial_bytes"] = partial_bytes(args[0], n_keys(args, extra))
            emit("ATTN", **rec)
            fused.CONFIG.clear()
            fused.CONFIG.update(default)


class OpCounter(TorchDispatchMode):
    FREE = ("view", "_unsafe_view", "expand", "slice", "select", "unsqueeze", "squeeze", "t", "transpose",
            "permute", "as_strided", "alias", "detach", "empty", "empty_like", "empty_strided", "reshape")

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func._schema.name.split("::")[-1]] += 1
        return func(*args, **(kwargs or {}))

    def split(self) -> tuple[int, int]:
        free = sum(n for op, n in self.ops.items() if op in self.FREE)
        return sum(self.ops.values()) - free, free


def count_ops():
    launches = collections.Counter()

    def counting_launcher(fn, t):
        class Launch:
            def __getitem__(self, grid):
                def run(*a, **k):
                    launches[fn.__name__] += 1
                return run
        return Launch()

    fused.launcher = counting_launcher
    for name, kind, capacity in CASES:
        args, extra = inputs(kind, capacity, "cpu", torch.float32)
        for arm, fn in (("reference", _attend), ("kernel", fused.attention)):
            launches.clear()
            with OpCounter() as c:
                fn(*args, **extra)
            compute, free = c.split()
            emit("ATTN_OPS", case=name, arm=arm, aten_ops=compute + free, aten_kernel_ops=compute,
                 aten_views_allocs=free, triton_launches=sum(launches.values()), ops=dict(c.ops))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"kernel launch configs, of {list(CONFIGS)}")
    p.add_argument("--ops", action="store_true", help="count aten ops and launches per arm on CPU instead")
    a = p.parse_args()
    if a.ops:
        count_ops()
    else:
        bench(a.configs.split(","))


if __name__ == "__main__":
    main()
