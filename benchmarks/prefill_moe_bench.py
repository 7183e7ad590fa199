"""Prefill's routed experts at Flash's per-rank shapes (one GPU): the FP4 grouped kernel's launch configurations
against the dense path (the stacks dequantised by dsv4.kernels.dequant, then torch._grouped_mm).

    python benchmarks/prefill_moe_bench.py [--tokens 64,4096,8192] [--arms REGEX] [--n-local 128]

A rank of 2 holds 128 of the 256 experts (I 2048, D 4096, FP4 with ue8m0 scales); T tokens pick 6 distinct
experts each, uniformly, so about half the T*6 pairs are local (what moe_prefill.grouped_experts sorts and
hands on). --n-local 256: one GPU holding all (mini, world 1). The "tc*" arms are dsv4.kernels.moe_tc (the
tensor-core tiles a short chunk takes) under CONFIG overrides, the "pairs" arm the decode kernels; both return
the weighted sum over k, compared with the dense path's; each tc arm's output also with the first tc arm's, bit for
bit (bit_equal_<arm>: whether a tile shape changes a pair's sums). Each arm is timed with CUDA events (median of --reps after a warm-up) and compared with the dense
path's output (max relative error). Records (dsv4.receipts):
  PMOE       T, arm, config, ms, TFLOPS (the pairs' 3 products), max_rel_err against the dense path
  PMOE_BEST  T, the fastest arm
  PMOE_DEQUANT  (--dequant) one layer's gate|up stacks dequantised per dequant.CONFIG: ms, GB/s, bit_equal
"""

from __future__ import annotations

import argparse
import re
import statistics

import torch

from dsv4.formats import QWeight
from dsv4.kernels import dequant, prefill_moe
from dsv4.model import moe_prefill
from dsv4.receipts import emit

D, I, N_LOCAL, TOTAL, TOPK, LIMIT = 4096, 2048, 128, 256, 6, 10.0
VARIANTS = {  # prefill_moe.CONFIG overrides
    "base": {},
    "bm128": {"max_block_m": 128},
    "bm128_w8": {"max_block_m": 128, "num_warps": 8},
    "bm128_n128_w8": {"max_block_m": 128, "block_n": 128, "num_warps": 8},
    "bm128_k64_w8_s4": {"max_block_m": 128, "block_k": 64, "num_warps": 8, "num_stages": 4},
    "bm64_n128_w8": {"block_n": 128, "num_warps": 8},
    "bm128_n64_k64_w4_s4": {"max_block_m": 128, "block_k": 64, "num_stages": 4},
}


TC_VARIANTS = {  # moe_tc.CONFIG overrides
    "tc": {}, "tc_n128": {"block_n": 128}, "tc_n64_planes": {"block_n": 64, "order": "planes"},
    "tc_planes": {"order": "planes"}, "tc_k256": {"block_k": 256}, "tc_w8": {"num_warps": 8},
    "tc_s4": {"num_stages": 4}, "tc_bm32": {"block_m": 32}, "tc_bm64": {"block_m": 64},
    "tc_bm64_n128_w8": {"block_m": 64, "block_n": 128, "num_warps": 8},
    "tc_bm32_n128": {"block_m": 32, "block_n": 128}, "tc_bm64_n128": {"block_m": 64, "block_n": 128},
    "tc_bm128": {"block_m": 128}, "tc_bm64_s4": {"block_m": 64, "num_stages": 4},
    # DSV4_MOE_TC_ORDER=natural: one dot a K step over the inputs in their order (other bits than "tc")
    "tc_nat": {"order": "natural"}, "tc_nat_n128": {"order": "natural", "block_n": 128},
    "tc_nat_k256": {"order": "natural", "block_k": 256}, "tc_nat_w8": {"order": "natural", "num_warps": 8},
    "tc_nat_bm32_n128": {"order": "natural", "block_m": 32, "block_n": 128},
    "tc_nat_bm64_n128": {"order": "natural", "block_m": 64, "block_n": 128},
    # DSV4_MOE_TC_ORDER=planes_one: one dot a K step in the planes' order ("tc"'s bits: bit_equal_tc)
    "tc_one": {"order": "planes_one"}, "tc_one_n128": {"order": "planes_one", "block_n": 128},
    "tc_one_bm32_n128": {"order": "planes_one", "block_m": 32, "block_n": 128},
    "tc_one_bm64_n128": {"order": "planes_one", "block_m": 64, "block_n": 128},
    # DSV4_MOE_TC_BF16_DECODE: the FP4 words decoded straight to bf16 (session 23; the same bits: bit_equal_tc)
    "tc_bf16": {"bf16_decode": True}, "tc_fp16": {"bf16_decode": False}, "tc_bf16_w8": {"bf16_decode": True, "num_warps": 8},
    "tc_bf16_s4": {"bf16_decode": True, "num_stages": 4}, "tc_bf16_n256": {"bf16_decode": True, "block_n": 256},
    "tc_bm32_bf16": {"block_m": 32, "block_n": 128, "bf16_decode": True},
    "tc_bm64_bf16": {"block_m": 64, "block_n": 128, "bf16_decode": True},
}


DEQUANT_VARIANTS = {  # dequant.CONFIG overrides
    "dq_base": {}, "dq_r32_b128": {"block_r": 32, "block_b": 128}, "dq_r16_b256": {"block_r": 16, "block_b": 256},
    "dq_r32_b256_w8": {"block_r": 32, "block_b": 256, "num_warps": 8}, "dq_r64_b128_w8": {"block_r": 64, "block_b": 128, "num_warps": 8},
    "dq_r8_b512": {"block_r": 8, "block_b": 512},
}


def dequant_sweep(experts, reps):
    """One layer's gate|up stacks dequantised under each dequant.CONFIG: ms, GB/s (bytes read + written), equal
    to the default's output bit for bit."""
    default = dict(dequant.CONFIG)
    w = [experts["w1"], experts["w3"]]
    ref = moe_prefill.dequant_stack(w, torch.bfloat16)
    moved = sum(s.data.numel() + s.scale.numel() for s in w) + ref.numel() * ref.element_size()
    for name, over in DEQUANT_VARIANTS.items():
        dequant.CONFIG.update(default)
        dequant.CONFIG.update(over)
        try:
            out = moe_prefill.dequant_stack(w, torch.bfloat16)
            ms = timed(lambda: moe_prefill.dequant_stack(w, torch.bfloat16), reps)
        except Exception as e:  # noqa: BLE001 - a configuration the compiler refuses is a result
            emit("PMOE_DEQUANT", arm=name, config=over, error=str(e)[:200])
            continue
        emit("PMOE_DEQUANT", arm=name, config=over, ms=round(ms, 3), gb_s=round(moved / ms / 1e6, 1),
             bit_equal=bool(torch.equal(out, ref)))
        del out
    dequant.CONFIG.update(default)


def stacks(device):
    g = torch.Generator(device=device).manual_seed(0)

    def fp4(rows, cols):  # random e2m1 bytes, ue8m0 scales 2**-8..2**-1 (values of a trained expert's size)
        data = torch.randint(0, 256, (N_LOCAL, rows, cols // 2), generator=g, device=device, dtype=torch.uint8)
        scale = torch.randint(119, 127, (N_LOCAL, rows, cols // 32), generator=g, device=device, dtype=torch.uint8)
        return QWeight(data.view(torch.int8), scale.view(torch.float8_e8m0fnu), "fp4")

    return {"w1": fp4(I, D), "w3": fp4(I, D), "w2": fp4(D, I)}


def routing(T, device):
    g = torch.Generator(device=device).manual_seed(T)
    return torch.rand(T, TOTAL, generator=g, device=device).argsort(dim=-1)[:, :TOPK]


def pairs(T, device):
    ids = routing(T, device)
    local = ids  # this rank holds experts 0..127
    n = N_LOCAL
    key = torch.where((local >= 0) & (local < n), local, n).flatten()
    key, order = torch.sort(key, stable=True)
    ends = torch.searchsorted(key, torch.arange(n, device=device), right=True, out_int32=True)
    return order // TOPK, ends, int((key < n).sum())


def timed(fn, reps):
    if not torch.cuda.is_available():  # the CPU smoke run (--small, TRITON_INTERPRET=1): one call, no timing
        fn()
        return float("nan")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def attempt(T, name, over, run, reps):
    """(output, median ms) of an arm, or None once its error is printed (a configuration the compiler refuses is a
    result)."""
    try:
        y = run()
        return y, timed(run, reps)
    except Exception as e:  # noqa: BLE001
        emit("PMOE", T=T, arm=name, config=over, error=str(e)[:200])
        return None


def main():
    global D, I, N_LOCAL, TOTAL
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="16,64,128,256,4096")
    ap.add_argument("--arms", default=".")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--n-local", type=int, default=128, help="experts this GPU holds (256: all of them)")
    ap.add_argument("--dequant", action="store_true", help="also sweep dsv4.kernels.dequant's CONFIG")
    ap.add_argument("--small", action="store_true", help="CPU smoke run: tiny shapes (TRITON_INTERPRET=1)")
    args = ap.parse_args()
    N_LOCAL = args.n_local
    if args.small:
        D, I, N_LOCAL, TOTAL = 128, 128, 4, 8
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    experts = stacks(device)
    act = lambda gate, up: torch.nn.functional.silu(gate.clamp(max=LIMIT)) * up.clamp(-LIMIT, LIMIT)  # noqa: E731
    default = dict(prefill_moe.CONFIG)
    dequant.GPU_CHECKED = True  # this benchmark times the dense path with the dequant kernel
    if args.dequant:
        dequant_sweep(experts, args.reps)
    for T in (int(t) for t in args.tokens.split(",")):
        x = torch.randn(T, D, device=device, dtype=torch.bfloat16)
        src, ends, local_pairs = pairs(T, device)
        flops = 2 * 3 * local_pairs * D * I
        results = {}
        rows = x.index_select(0, src)
        ref = moe_prefill._dequantised(rows, ends, experts, act)
        valid = torch.arange(src.shape[0], device=device) < ends[-1]
        if re.search(args.arms, "dense"):
            ms = timed(lambda: moe_prefill._dequantised(rows, ends, experts, act), args.reps)
            ms_dq = timed(lambda: moe_prefill.dequant_stack([experts["w1"], experts["w3"]], torch.bfloat16), args.reps)
            results["dense"] = ms
            emit("PMOE", T=T, arm="dense", ms=round(ms, 3), tflops=round(flops / ms / 1e9, 1),
                 gate_up_dequant_ms=round(ms_dq, 3), local_pairs=local_pairs, max_rel_err=0.0)
        ids = routing(T, device)
        w = torch.rand(T, TOPK, device=device).to(torch.bfloat16)
        w = torch.where(ids < N_LOCAL, w, 0)
        want = None
        tc_first = None  # the first tc arm's output: whether a tile shape changes a pair's bits
        for name, over in [("pairs", None)] + list(TC_VARIANTS.items()):
            if not re.search(args.arms, name):
                continue
            if want is None:  # the dense path's rows back in pair order, weighted and summed over k
                mine = ids < N_LOCAL
                key = torch.where(mine, ids, N_LOCAL).flatten()
                key, order = torch.sort(key, stable=True)
                back = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=device))
                want = (torch.where((key < N_LOCAL).unsqueeze(-1), ref, 0.0).index_select(0, back).view(T, TOPK, -1)
                        * w.unsqueeze(-1)).sum(dim=1)
            experts_list = [experts[k] for k in ("w1", "w3", "w2")]
            if over is None:  # the decode kernels, a GEMV row per (token, expert) pair
                from dsv4.kernels import moe as fused_moe

                run = lambda: fused_moe.routed(x, ids, w, experts_list, 0, LIMIT)  # noqa: E731
            else:
                from dsv4.kernels import moe_tc

                tc_default = dict(moe_tc.CONFIG)
                moe_tc.CONFIG.update(over)
                run = lambda: moe_tc.routed(x, ids, w, experts_list, 0, LIMIT)  # noqa: E731
            try:
                measured = attempt(T, name, over, run, args.reps)
            finally:
                if over is not None:
                    moe_tc.CONFIG.clear()
                    moe_tc.CONFIG.update(tc_default)
            if measured is None:
                continue
            y, ms = measured
            err = ((y - want).float().abs().max() / want.float().abs().max()).item()
            results[name] = ms
            extra = {}
            if over is not None:
                tc_first = (name, y) if tc_first is None else tc_first
                extra = {"bit_equal_" + tc_first[0]: bool(torch.equal(y, tc_first[1]))}
            emit("PMOE", T=T, arm=name, config=over, ms=round(ms, 3), tflops=round(flops / ms / 1e9, 1),
                 max_rel_err=round(err, 5), **extra)
        for name, over in VARIANTS.items():
            if not re.search(args.arms, name):
                continue
            prefill_moe.CONFIG.update(default)
            prefill_moe.CONFIG.update(over)
            run = lambda: prefill_moe.experts(x, src, ends, [experts[k] for k in ("w1", "w3", "w2")], LIMIT)  # noqa: E731
            measured = attempt(T, name, over, run, args.reps)
            if measured is None:
                continue
            y, ms = measured
            err = ((y - ref).float().abs()[valid].max() / ref.float().abs()[valid].max()).item()
            results[name] = ms
            emit("PMOE", T=T, arm=name, config=over, ms=round(ms, 3), tflops=round(flops / ms / 1e9, 1),
                 block_m=prefill_moe.block_m(src.shape[0], N_LOCAL), max_rel_err=round(err, 5))
        prefill_moe.CONFIG.update(default)
        if results:
            best = min(results, key=results.get)
            emit("PMOE_BEST", T=T, arm=best, ms=round(results[best], 3))


if __name__ == "__main__":
    main()
