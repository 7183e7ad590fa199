"""Prefill attention of one layer (dsv4.kernels.prefill_attention) against its torch reference, Flash shapes.

One GPU, a chunk of T = 4096 queries of H = 64 heads (a rank of 2), head_dim 512, rope 64, sliding window
128, bf16. Cases: each layer kind (sliding, CSA with 512 indexer picks, HCA at rate 128) for the first
chunk of a prompt (position 0, store of a 4k capacity) and for a chunk at 28,672 of a 32k prompt (the ring
full, every pick valid, 224 HCA rows committed). Random state; the masks are the real ones (step.Step);
CSA's picks are the top-k of random scores over the visible compressed rows.

For each case, correctness first: the kernel's largest error against the reference run in float32 on the
same bf16 inputs, relative to the output's largest magnitude (the GPU test's bound is 2**-7), and
whether two runs are bit-identical. Then each arm's microseconds per call: the median of --reps calls
timed with CUDA events after a warm-up. Useful work: the (query, key) pairs the masks let through, each
2 * 2 * head_dim flops per head (q.k and p.v); TFLOP/s = that over the time (the reference computes
every query against the whole chunk, so its useful rate is low by design). One PATTN record per (case,
arm), kernel arms per launch config.

Usage: python benchmarks/prefill_attention_bench.py [--configs default,s3,...] [--tokens 4096] [--reps 10]
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.attention_bench import timed_eager as timed
from dsv4.config import CSA, HCA, SLIDING, preset
from dsv4.kernels import prefill_attention as pattn
from dsv4.model.attention import _attend
from dsv4.model.rope import Rope
from dsv4.model.step import Step
from dsv4.receipts import emit

HEADS = 64
KINDS = {"sliding": SLIDING, "csa": CSA, "hca": HCA}
STARTS = {"first": (0, 4096), "at28k": (28672, 32768)}  # (position, capacity)
CONFIGS = {
    "default": {},
    "s3": {"num_stages": 3},
    "s1": {"num_stages": 1},
    "n64": {"block_n": 64},
    "n16": {"block_n": 16},
    "h32": {"block_h": 32},
    "skips": {"skip_picks": True, "skip_rows": False},
}


def inputs(kind, pos: int, capacity: int, T: int, device, dtype, seed: int = 0):
    """(args, extra) of pattn.attention / _attend: a random state of one layer for a chunk of T at pos."""
    cfg = preset("flash")
    g = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device=device) * scale).to(dtype)

    hd, W = cfg.head_dim, cfg.sliding_window
    step = Step(torch.tensor(pos, device=device), T, Rope(cfg, device), W)
    visible, _ = step.sliding()
    cos, sin = step.cos_sin("main" if kind == SLIDING else "compress")
    args = (rand(T, HEADS, hd, scale=3.0), rand(W, hd), rand(T, hd), visible,
            torch.randn(HEADS, generator=g, device=device), cos, sin)
    if kind == SLIDING:
        return args, {}
    m = cfg.compress_rates[kind]
    rows = capacity // m + 2
    win = step.windows(m, 2 * m if kind == CSA else m, rows)
    comp, new = rand(rows, hd), rand(win.wids.shape[0], hd)
    if kind == HCA:
        return args, dict(comp=comp, new=new, committed=win.committed, new_visible=win.visible)
    scores = torch.randn(T, rows + new.shape[0], generator=g, device=device)
    scores = scores.masked_fill(~torch.cat([win.committed.expand(T, -1), win.visible], -1), float("-inf"))
    ordered, order = torch.sort(scores, dim=-1, descending=True, stable=True)
    k = min(cfg.index_topk, scores.shape[-1])
    return args, dict(comp=comp, new=new, sel=order[:, :k], valid=ordered[:, :k] > float("-inf"))


def useful_flops(args, extra) -> tuple[int, int]:
    """(visible (query, key) pairs, their flops over every head: q.k and p.v)."""
    T, H, hd = args[0].shape
    pairs = int(args[3].sum())
    if "sel" in extra:
        pairs += int(extra["valid"].sum())
    elif extra:
        pairs += T * int(extra["committed"].sum()) + int(extra["new_visible"].sum())
    return pairs, pairs * H * 4 * hd


def bench(configs, T: int, reps: int, reference: bool):
    for start, (pos, capacity) in STARTS.items():
        for kname, kind in KINDS.items():
            args, extra = inputs(kind, pos, capacity, T, "cuda", torch.bfloat16)
            assert pattn.supported(*args, **extra)
            up = [a.float() if a.is_floating_point() else a for a in args]
            ref32 = _attend(*up, **{k: v.float() if v.is_floating_point() else v for k, v in extra.items()})
            pairs, flops = useful_flops(args, extra)
            case = dict(case=f"{kname}_{start}", pos=pos, tokens=T, heads=HEADS, pairs=pairs, useful_gflop=flops / 1e9)
            arms = [(f"kernel_{c}", CONFIGS[c], lambda: pattn.attention(*args, **extra)) for c in configs]
            if reference:
                arms.insert(0, ("reference", {}, lambda: _attend(*args, **extra)))
            default = dict(pattn.CONFIG)
            for arm, cfg, fn in arms:
                pattn.CONFIG.update(cfg)
                first, second = fn(), fn()
                us = timed(fn, reps)
                emit("PATTN", **case, arm=arm, config=dict(pattn.CONFIG) if arm != "reference" else None,
                     max_rel_err=float((first.float() - ref32).abs().max() / ref32.abs().max()),
                     deterministic=bool(torch.equal(first, second)), us=us, useful_tflops=flops / us / 1e6)
                pattn.CONFIG.clear()
                pattn.CONFIG.update(default)
            del ref32
            torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"kernel launch configs, of {list(CONFIGS)}")
    p.add_argument("--tokens", type=int, default=4096, help="queries in the chunk")
    p.add_argument("--reps", type=int, default=10, help="timed calls per arm (median)")
    p.add_argument("--no-reference", action="store_true", help="time the kernel arms only")
    a = p.parse_args()
    bench(a.configs.split(","), a.tokens, a.reps, not a.no_reference)


if __name__ == "__main__":
    main()
