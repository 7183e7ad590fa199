"""The MoE decode kernels (dsv4.kernels.moe) per launch configuration at Flash's per-rank shapes, against
the device's copy bandwidth measured in the same run.

Rank 0 of --world ranks: the 256 / world local FP4 experts (I 2048, D 4096) stacked, the shared expert's
FP8 gate/up rows 0..I/world-1. Each (op, T, variant) is captured as `calls` calls in one CUDA graph,
replayed --reps times; the figure is the median per call. Every call routes its T tokens to 6 of the
256 experts afresh (uniformly, so about half local), so consecutive calls read other experts' bytes,
not the previous call's from L2. Bytes are what a call must read: the data and scales of the distinct
local experts its routes select (gate/up: w1 and w3; routed: w1, w3, w2), averaged over the calls.

Ops: "gate_up" (kernel 1 on the routed experts), "routed" (kernels 1 and 2: the layer's routed MoE),
"shared_gate_up" (kernel 1 on the shared expert's rows). Before timing, each variant's routed output is
compared with the torch reference (max_rel_err, as benchmarks/qgemv_bench.py) and with the "base"
variant's (bit_equal_base: variants of the same summation order must be equal; a tensor-core "tc*" variant with
the "tc" variant's, a Gluon "gl*" variant with the "gl" variant's: whether its tile shape changes a sum); launches: kernels one
eager call launches (torch profiler).

Prints:
  MOE_BANDWIDTH {...}
  MOE {"op", "T", "variant", "config", "us", "bytes", "gb_s", "fraction", "launches", ...} per arm
  MOE_BEST {...} per (op, T): the fastest variant within tolerance
"""

from __future__ import annotations

import argparse
import math
import re
import statistics

import torch

from benchmarks import qgemv_bench as qb
from dsv4.config import preset
from dsv4.formats import QWeight
from dsv4.kernels import moe as fused_moe
from dsv4.kernels import moe_gl, moe_tc
from dsv4.model import moe as moe_mod
from dsv4.model.rows import rows_alone
from dsv4.receipts import emit

VARIANTS = {  # fused_moe.CONFIG overrides; "base" is the default configuration
    "base": {},
    "plain": {"gate_up_paired": False, "down_split_experts": False},  # before session 8's options
    "compact": {"compact": True},
    "n8": {"gate_up_block_n": 8},
    "n8_compact": {"gate_up_block_n": 8, "compact": True},
    "n32_w8": {"gate_up_block_n": 32, "num_warps": 8},
    "k512": {"block_k_fp4": 512},
    "split2": {"gate_up_split_k": 2},
    "split4": {"gate_up_split_k": 4},
    "split8": {"gate_up_split_k": 8},
    "split2_compact": {"gate_up_split_k": 2, "compact": True},
    "split4_compact": {"gate_up_split_k": 4, "compact": True},
    "split4_n8_compact": {"gate_up_split_k": 4, "gate_up_block_n": 8, "compact": True},
    "split4_k512": {"gate_up_split_k": 4, "block_k_fp4": 512},
    "split4_sum_launch": {"gate_up_split_k": 4, "fused_sum": False},
    "paired": {"gate_up_paired": True},
    "paired_split4": {"gate_up_paired": True, "gate_up_split_k": 4},
    "paired_n8": {"gate_up_paired": True, "gate_up_block_n": 8},
    "down_split": {"down_split_experts": True, "down_split_tokens": 64},
    "down_split_n8": {"down_split_experts": True, "down_split_tokens": 64, "down_block_n": 8},
    "paired_down_split": {"gate_up_paired": True, "down_split_experts": True, "down_split_tokens": 64},
    "paired_split4_down_split": {"gate_up_paired": True, "gate_up_split_k": 4, "down_split_experts": True,
                                 "down_split_tokens": 64},
    "paired_n8_down_split_n8": {"gate_up_paired": True, "gate_up_block_n": 8, "down_split_experts": True,
                                "down_split_tokens": 64, "down_block_n": 8},
    # The experts on the tensor cores (dsv4.kernels.moe_tc; "tc": its CONFIG overrides, mode "all"): tiles of 16 pairs
    # of one expert, a program's outputs (n), each K step's inputs (k), pipeline stages (s), warps (w).
    "tc": {"tc": {}},
    "tc_n64_k128_s1": {"tc": {"block_n": 64, "block_k": 128, "num_stages": 1}},
    "tc_n64_k256_s3": {"tc": {"block_n": 64, "block_k": 256, "num_stages": 3}},
    "tc_n128_k128_s3_w8": {"tc": {"block_n": 128, "block_k": 128, "num_stages": 3, "num_warps": 8}},
    "tc_n32_k256_s3": {"tc": {"block_n": 32, "block_k": 256, "num_stages": 3}},
    # The pair kernels with the registers laid out by hand (dsv4.kernels.moe_gl; "gl": its CONFIG overrides, on): rows
    # a thread (rn), warps (w). A row's sums do not depend on either (bit_equal_base: against "gl").
    "gl": {"gl": {}},
    "gl_rn2": {"gl": {"rows_per_thread": 2}},
    "gl_rn8": {"gl": {"rows_per_thread": 8}},
    "gl_rn2_w8": {"gl": {"rows_per_thread": 2, "num_warps": 8}},
    "gl_rn4_w8": {"gl": {"rows_per_thread": 4, "num_warps": 8}},
    "gl_s4": {"gl": {"shared_tokens": 4}},  # the shared expert's tokens a program (gate_up_and_shared)
    # session 26: kernel 1's registers follow the shared programs' tokens (sm_90 under PDL, a 16-token step: 8 tokens
    # 131 registers, 3 blocks an SM; 4 tokens 128, 4 blocks; 2 tokens 96, 5 blocks); each token's sums the same
    "gl_s2": {"gl": {"shared_tokens": 2}},
    # session 37 (the shared programs' next K step first): grouped at 16 tokens 8 tokens 128 registers, 4 96, 2 86
    "gl_s8": {"gl": {"shared_tokens": 8}},
    "gl_solo8": {"gl": {"shared_tokens_solo": 8}},  # a one-token step's shared programs of 8 (before session 16)
    "gl_srn2": {"gl": {"shared_rows_per_thread": 2}},  # the shared expert's rows a thread
    # kernel 1's routed programs on the tensor cores (moe_gl CONFIG mma): 16-row tiles a program x groups a step
    "gl_mma1x4": {"gl": {"mma": True, "mma_tiles": 1, "mma_unroll": 4}},
    "gl_mma1x8": {"gl": {"mma": True, "mma_tiles": 1, "mma_unroll": 8}},
    "gl_mma1x2": {"gl": {"mma": True, "mma_tiles": 1, "mma_unroll": 2}},
    "gl_mma1x4_up": {"gl": {"mma": True, "mma_tiles": 1, "mma_unroll": 4, "mma_down": False}},  # kernel 1 only
    # a step's pairs grouped by expert (moe_gl CONFIG grouped, on by default since session 26; dsv4.kernels.expert_groups):
    # up to 8 pairs of one expert a tensor-core program, one a column; the table's launch is in the timed call;
    # "gl_pairs" a program a pair, as before (bit_equal_base: "gl")
    "gl_grouped": {"gl": {"grouped": True}},
    "gl_pairs": {"gl": {"grouped": False}},
    # kernel 1's registers capped at 128 a thread (moe_gl CONFIG gate_up_maxnreg): 4 blocks an SM where 131 allow 3
    "gl_maxnreg128": {"gl": {"gate_up_maxnreg": 128}},
    "gl_maxnreg120": {"gl": {"gate_up_maxnreg": 120}},
    # a one-token step's kernels capped so that the launch is one wave (moe_gl CONFIG solo_gate_up_maxnreg,
    # solo_down_maxnreg): kernel 1 at 72 / 64 registers (7 / 8 blocks an SM for 6); kernel 2 uncapped (54 registers,
    # 9 blocks an SM; capped at 40, 12, by default since session 38)
    "gl_solo72": {"gl": {"solo_gate_up_maxnreg": 72}},
    "gl_solo64": {"gl": {"solo_gate_up_maxnreg": 64}},
    "gl_down_uncapped": {"gl": {"solo_down_maxnreg": 0}},
}
SHARED_VARIANTS = {
    "base": {},
    "shared_n8": {"shared_block_n": 8},
    "shared_n16": {"shared_block_n": 16},
    "shared_split2": {"shared_split_k": 2},
    "shared_split4": {"shared_split_k": 4},
    "shared_split4_n8": {"shared_split_k": 4, "shared_block_n": 8},
    "shared_split8_n16": {"shared_split_k": 8, "shared_block_n": 16},
    "shared_split4_sum_launch": {"shared_split_k": 4, "fused_sum": False},
}


def launches(fn) -> tuple[int | None, dict]:
    """(kernels one call of fn launches, memcpy/memset not counted; their device time by name in us), eager, after
    a warm call; (None, {}) off CUDA."""
    if qb.DEVICE != "cuda":
        return None, {}
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
              and not (e.name.startswith("Memcpy") or e.name.startswith("Memset"))]
    times: dict = {}
    for e in events:
        times[e.name[:40]] = round(times.get(e.name[:40], 0.0) + e.device_time_total, 1)
    return len(events), times


def expert_bytes(w: QWeight) -> int:
    return w.data[0].nbytes + w.scale[0].nbytes


class Bench:
    def __init__(self, cfg, world: int, arms: re.Pattern, calls: int, bw: float):
        self.cfg, self.arms, self.calls, self.bw = cfg, arms, calls, bw
        D, I = cfg.hidden_size, cfg.moe_intermediate_size
        self.n_local = cfg.n_routed_experts // world
        self.stacks = [qb.random_weight("fp4", n, k, (self.n_local,)) for n, k in ((I, D), (I, D), (D, I))]
        self.shared = [qb.random_weight("fp8", I // world, D) for _ in range(2)]
        self.best: dict[tuple, tuple[str, float]] = {}

    def routes(self, T: int):
        """calls x ([T, k] expert ids, [T, k] routing weights): k distinct experts of all ranks' per token."""
        cfg, gen = self.cfg, torch.Generator().manual_seed(T)
        k = cfg.num_experts_per_tok
        out = []
        for _ in range(self.calls):
            ids = torch.stack([torch.randperm(cfg.n_routed_experts, generator=gen)[:k] for _ in range(T)])
            weights = torch.softmax(torch.randn(T, k, generator=gen), -1)
            out.append((ids.to(qb.DEVICE), weights.to(qb.DEVICE, torch.bfloat16)))
        return out

    def local_bytes(self, routes, stacks) -> int:
        per = sum(expert_bytes(w) for w in stacks)
        distinct = [len({e for e in ids.flatten().tolist() if e < self.n_local}) for ids, _ in routes]
        return round(per * statistics.mean(distinct))

    def arm(self, op: str, T: int, variant: str, overrides: dict, fn, nbytes: int, check):
        """check() -> (max_rel_err, bit_equal_base or None) under the variant's configuration."""
        if not self.arms.search(variant):
            return
        try:
            pairs = [(fused_moe.CONFIG, {k: v for k, v in overrides.items() if k not in ("tc", "gl")})]
            if "tc" in overrides:
                pairs.append((moe_tc.CONFIG, {"mode": "all", **overrides["tc"]}))
            if "gl" in overrides:
                pairs.append((moe_gl.CONFIG, {"on": True, **overrides["gl"]}))
            with qb.configured("triton", *pairs):
                err, equal = check()
                n_launches, kernel_us = launches(lambda: fn(0))
                us = qb.timed(fn, self.calls)
        except Exception as e:  # noqa: BLE001 - a variant that fails to compile or run is reported, not fatal
            emit("MOE", op=op, T=T, variant=variant, error=f"{type(e).__name__}: {str(e)[:300]}")
            return
        if err <= qb.TOLERANCE and (self.best.get((op, T), ("", math.inf))[1] > us):
            self.best[(op, T)] = (variant, us)
        emit("MOE", op=op, T=T, variant=variant, config=overrides, us=round(us, 2), bytes=nbytes,
             gb_s=round(nbytes / us / 1e3, 1), fraction=round(nbytes / (us * 1e-6) / self.bw, 3), launches=n_launches,
             max_rel_err=err, bit_equal_base=equal, calls=self.calls, kernel_us=kernel_us)

    def routed(self, T: int):
        cfg, stacks, n = self.cfg, self.stacks, self.n_local
        routes = self.routes(T)
        x = torch.randn(T, cfg.hidden_size, device=qb.DEVICE, dtype=torch.bfloat16)
        experts = dict(zip(("w1", "w3", "w2"), stacks))
        ids, weights = routes[0]
        with qb.configured("torch"), rows_alone():  # a decode step's rows: the path run_routed times
            expected = moe_mod.routed(x, ids, weights, experts, 0, cfg)
        with qb.configured("triton", (fused_moe.CONFIG, VARIANTS["base"])), rows_alone():
            base = moe_mod.routed(x, ids, weights, experts, 0, cfg)
        with qb.configured("triton", (moe_tc.CONFIG, {"mode": "all"})), rows_alone():
            tc_base = moe_mod.routed(x, ids, weights, experts, 0, cfg)
        gl_base = None
        if qb.DEVICE == "cuda" and moe_gl.gl is not None:
            with qb.configured("triton", (moe_gl.CONFIG, {"on": True})), rows_alone():
                gl_base = moe_mod.routed(x, ids, weights, experts, 0, cfg)

        def run_routed(i):  # the tensor-core arms (moe_tc mode "all") through moe_tc, as dsv4.model.moe chooses
            ids, weights = routes[i]
            kernel = moe_tc.routed if moe_tc.CONFIG["mode"] == "all" else fused_moe.routed
            return kernel(x, ids, torch.where((ids >= 0) & (ids < n), weights, 0), stacks, 0, cfg.swiglu_limit)

        def run_gate_up(i):  # with the groups' table where moe_gl CONFIG grouped takes one (built in the call)
            ids = routes[i][0]
            return fused_moe._gate_up(x, stacks[0], stacks[1], ids, 0, n, cfg.num_experts_per_tok, cfg.swiglu_limit,
                                      fused_moe.CONFIG["gate_up_block_n"], fused_moe.CONFIG["gate_up_split_k"],
                                      fused_moe.groups_for(x, ids, stacks[0], stacks[1]))

        def check():  # a tensor-core variant against the tensor cores' default tiles (another summation order)
            with rows_alone():
                got = moe_mod.routed(x, ids, weights, experts, 0, cfg)
            against = tc_base if moe_tc.CONFIG["mode"] == "all" else gl_base if moe_gl.CONFIG["on"] else base
            return qb.rel_err(got, expected), torch.equal(got, against)

        gate_up_bytes, routed_bytes = self.local_bytes(routes, stacks[:2]), self.local_bytes(routes, stacks)
        for variant, overrides in VARIANTS.items():
            if "tc" not in overrides:  # kernel 1 alone is the pair kernels'
                self.arm("gate_up", T, variant, overrides, run_gate_up, gate_up_bytes, check)
            self.arm("routed", T, variant, overrides, run_routed, routed_bytes, check)

    def shared_gate_up(self, T: int):
        cfg, (w1, w3) = self.cfg, self.shared
        x = torch.randn(T, cfg.hidden_size, device=qb.DEVICE, dtype=torch.bfloat16)
        with qb.configured("torch"):
            expected = moe_mod.swiglu_act(moe_mod.linear(x, w1), moe_mod.linear(x, w3), cfg.swiglu_limit)
        with qb.configured("triton", (fused_moe.CONFIG, SHARED_VARIANTS["base"])):
            base = fused_moe.shared_gate_up(x, w1, w3, cfg.swiglu_limit)
        # Copies of the pair, rotated so that no call finds its bytes in L2.
        copies = max(1, math.ceil(qb.L2_DEFEAT / (w1.nbytes + w3.nbytes)))
        pairs = [(w1, w3)] + [tuple(qb.random_weight("fp8", *w1.shape) for _ in range(2)) for _ in range(copies - 1)]

        def run(i):
            a, b = pairs[i % copies]
            return fused_moe.shared_gate_up(x, a, b, cfg.swiglu_limit)

        def check():
            got = run(0)
            return qb.rel_err(got, expected), torch.equal(got, base)

        for variant, overrides in SHARED_VARIANTS.items():
            self.arm("shared_gate_up", T, variant, overrides, run, w1.nbytes + w3.nbytes, check)

        # Kernel 1 of a layer as dsv4.model.moe runs it: the routed rows and the shared expert's in one launch
        # (routed_and_shared_gate_up), the pair kernels' ("base") and the Gluon kernels' ("gl*": the shared rows
        # FP8 in the routed launch). Checked: the shared rows against the torch reference.
        stacks, routes = self.stacks, self.routes(T)

        def run_both(i):
            a, b = pairs[i % copies]
            ids = routes[i][0]
            return fused_moe.routed_and_shared_gate_up(x, ids, stacks[0], stacks[1], 0, a, b, cfg.swiglu_limit,
                                                       fused_moe.groups_for(x, ids, stacks[0], stacks[1]))

        def check_both():
            got = run_both(0)[1]
            return qb.rel_err(got, expected), torch.equal(got, base)

        both_bytes = self.local_bytes(routes, stacks[:2]) + w1.nbytes + w3.nbytes
        for variant in ("base", "gl", "gl_s8", "gl_s4", "gl_s2", "gl_solo8", "gl_srn2", "gl_mma1x2", "gl_mma1x4",
                        "gl_mma1x8", "gl_grouped", "gl_pairs", "gl_maxnreg128", "gl_maxnreg120", "gl_solo72",
                        "gl_solo64"):
            if variant in VARIANTS:
                self.arm("gate_up_and_shared", T, variant, VARIANTS[variant], run_both, both_bytes, check_both)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--tokens", default="1,2,4,8", help="decode rows per call, comma-separated")
    ap.add_argument("--arms", default=".", help="regex over variant names (e.g. 'base|split4')")
    ap.add_argument("--calls", type=int, default=64, help="calls per captured graph")
    args = ap.parse_args()
    bw = qb.bandwidth()
    emit("MOE_BANDWIDTH", bytes_per_s=bw, device=torch.cuda.get_device_name() if qb.DEVICE == "cuda" else qb.DEVICE,
         scope="d2d copy of 2 GiB, read+written (qgemv_bench.bandwidth)")
    bench = Bench(preset("flash"), args.world, re.compile(args.arms), args.calls, bw)
    for T in (int(t) for t in args.tokens.split(",")):
        bench.routed(T)
        bench.shared_gate_up(T)
    for (op, T), (variant, us) in bench.best.items():
        emit("MOE_BEST", op=op, T=T, variant=variant, us=round(us, 2))


if __name__ == "__main__":
    main()
