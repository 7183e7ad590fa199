"""The dense GEMV (dsv4.kernels.dense) against cuBLAS, per Flash dense shape of one rank and per row count.

A decode step's dense products (bf16: the compressors' wkv/wgate, the indexer's weights_proj and its
compressor, the router gate, the head's vocab slice; fp32: mHC's mixes) run today through cuBLAS,
row by row when a step holds several sequences (dsv4.model.rows: a GEMM's kernel, and so a row's
bits, depends on its row count). Arms, for rows 1, 4, 16, 32 (--rows):
  kernel_<variant>  one launch for all rows (dsv4.kernels.dense, CONFIG overrides of VARIANTS);
  cublas            F.linear over all rows at once (what a step could do if rows did not have to be alone);
  cublas_per_row    F.linear on each row (what rows_alone runs today; rows > 1 only).
Each arm is captured as `calls` calls in one CUDA graph and replayed (benchmarks/qgemv_bench.py's
timing: median microseconds per call; the calls rotate over copies of the weight, at least 256 MiB of
them, so that no call finds its weight in L2). Bytes: the weight, x and y, each once (the rows of
one weight tile read it from L2 after the first). Checks before timing: max_rel_err against F.linear
in float64 (largest difference over the largest magnitude), and rows_exact: every row of the
all-rows launch equals that row launched alone, bit for bit (the kernel must; cuBLAS need not).

One GPU; a few minutes (Triton compiles each variant once). Prints:
  BANDWIDTH {...}
  DENSE {"shape", "rows", "arm", "us", "bytes", "gb_s", "fraction", "max_rel_err", "rows_exact", ...}
  DENSE_BEST {...} per shape and rows: the fastest kernel variant within tolerance and row-exact
  DENSE_TOKEN {...} per rows: one token's dense products on rank 0 (counts from the checkpoint layout),
    summed for the default kernel, v3, the best kernel variant per shape, cublas and cublas_per_row
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import math
import re

import torch
import torch.nn.functional as F

from benchmarks.qgemv_bench import bandwidth, configured, timed
from dsv4.config import preset
from dsv4.kernels import dense as dense_kernel
from dsv4.layout import tensor_specs
from dsv4.receipts import emit

VARIANTS = {  # dense_kernel.CONFIG overrides (tests/compile_kernels.py compiles each)
    "default": {},
    "flat": {"shape_tiles": False},  # CONFIG's tiles for every shape (main before session 20's head tiles)
    "head_k256B": {"head_block_k_bytes": 256},
    "head_k512B_n8": {"head_block_k_bytes": 512, "block_n": 8},
    "n8": {"block_n": 8},
    "n32_w8": {"block_n": 32, "num_warps": 8},
    "k512B": {"block_k_bytes": 512},
    "k2048B": {"block_k_bytes": 2048},
    "programs528": {"programs": 528},
    "rows1": {"rows": 1},  # a program per row (the default: up to 8 rows per program, fewer on the head)
    "rows16": {"rows": 16},
    "rows16_acc256": {"rows": 16, "acc_regs": 256},  # more rows on the head's carried tiles (it spills)
    "v3": {"kernel": "v3"},  # tensor-core tiles of 16 rows (bf16 shapes; fp32 ones keep the kernel above)
    "v3_n16_k512": {"kernel": "v3", "v3_block_n": 16, "v3_block_k": 512},
    "v3_n64_k128": {"kernel": "v3", "v3_block_n": 64, "v3_block_k": 128},
    "v3_programs528": {"kernel": "v3", "programs": 528},
}
L2_DEFEAT = 256 << 20
MAX_COPIES = 256
DEVICE = "cuda"  # tests/test_dense_kernel.py runs the bookkeeping on CPU through the interpreter
TOLERANCE = 2 ** -7  # bf16 outputs: one rounding (2**-8) plus fp32 accumulation


def token_shapes(cfg, world: int) -> collections.Counter:
    """(N, K, dtype) -> launches per token on rank 0: the 2-D bf16 and fp32 weights a decode step
    multiplies (the embedding is a lookup), as the checkpoint layout gives them."""
    counts = collections.Counter()
    for name, spec in tensor_specs(cfg, 0, world).items():
        product = name.endswith(".weight") or name.endswith("_fn")  # not the compressors' ape
        if len(spec.shape) != 2 or spec.kind not in ("bf16", "fp32") or not product or name == "embed.weight":
            continue
        shape = list(spec.shape)
        if spec.split is not None:
            dim, parts, _ = spec.split
            shape[dim] //= parts
        counts[(*shape, torch.bfloat16 if spec.kind == "bf16" else torch.float32)] += 1
    return counts


def names(cfg, world: int) -> dict:
    """(N, K, dtype) -> the weights of that shape (Flash: the router gate and the indexer's compressor
    are both [256, 4096])."""
    hd, dI, D, hc = cfg.head_dim, cfg.index_head_dim, cfg.hidden_size, cfg.hc_mult
    bf16, fp32 = torch.bfloat16, torch.float32
    labels = collections.defaultdict(list)
    for key, name in (((2 * hd, D, bf16), "compressor.wkv|wgate (CSA)"), ((hd, D, bf16), "compressor.wkv|wgate (HCA)"),
                      ((2 * dI, D, bf16), "indexer.compressor.wkv|wgate"),
                      ((cfg.index_n_heads, D, bf16), "indexer.weights_proj"),
                      ((cfg.n_routed_experts, D, bf16), "gate (router)"), (((2 + hc) * hc, hc * D, fp32), "mhc mix"),
                      ((hc, hc * D, fp32), "mhc head mix"), ((cfg.vocab_size // world, D, bf16), "head")):
        labels[key].append(name)
    return {key: " + ".join(v) for key, v in labels.items()}


def random_weight(n: int, k: int, dtype) -> torch.Tensor:
    return (torch.randn(n, k, device=DEVICE) * 0.02).to(dtype)


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref).abs().max() / ref.abs().max())


def per_row(x, w):
    return torch.cat([F.linear(x[r:r + 1], w) for r in range(x.shape[0])])


class Runner:
    def __init__(self, bw: float, arms: re.Pattern):
        self.bw, self.arms = bw, arms
        self.times: dict = collections.defaultdict(dict)  # (shape, rows) -> arm -> us (correct arms only)

    def arm(self, key, arm: str, fn, x, ref, alone, nbytes: int, calls: int, context, **info):
        """Check fn(0) against the float64 ref and the rows alone, then time it; a failure is reported."""
        if not self.arms.search(arm):
            return
        try:
            with context():
                out = fn(0)
                err = rel_err(out, ref)
                rows_exact = all(torch.equal(out[r:r + 1], alone(x[r:r + 1])) for r in range(x.shape[0]))
                us = timed(fn, calls)
        except Exception as e:  # noqa: BLE001
            emit("DENSE", shape=key[0], rows=key[1], arm=arm, error=f"{type(e).__name__}: {str(e)[:300]}")
            return
        if err <= TOLERANCE and (rows_exact or not arm.startswith("kernel")):
            self.times[key][arm] = us
        emit("DENSE", shape=key[0], rows=key[1], arm=arm, us=round(us, 2), bytes=nbytes,
             gb_s=round(nbytes / us / 1e3, 1), fraction=round(nbytes / (us * 1e-6) / self.bw, 3),
             max_rel_err=err, rows_exact=rows_exact, calls=calls, **info)


def bench_shape(run: Runner, name: str, n: int, k: int, dtype, rows_list):
    one = random_weight(n, k, dtype)
    w_bytes = one.numel() * one.element_size()
    copies = min(MAX_COPIES, max(1, math.ceil(L2_DEFEAT / w_bytes)))
    weights = [one] + [random_weight(n, k, dtype) for _ in range(copies - 1)]
    calls = max(50, copies)
    for rows in rows_list:
        x = torch.randn(rows, k, device=DEVICE).to(dtype)
        ref = F.linear(x.double(), one.double())
        nbytes = w_bytes + (x.numel() + rows * n) * x.element_size()
        info = dict(N=n, K=k, dtype=str(dtype).removeprefix("torch."), copies=copies)
        key = (name, rows)
        run.arm(key, "cublas", lambda i: F.linear(x, weights[i % copies]), x, ref, lambda r: F.linear(r, one),
                nbytes, calls, contextlib.nullcontext, **info)
        if rows > 1:
            run.arm(key, "cublas_per_row", lambda i: per_row(x, weights[i % copies]), x, ref,
                    lambda r: F.linear(r, one), nbytes, calls, contextlib.nullcontext, **info)
        for variant, overrides in VARIANTS.items():
            with configured(None, (dense_kernel.CONFIG, overrides)):
                v3 = dense_kernel.uses_v3(x, one)
                _, k_chunk, splits = dense_kernel.tiling3(n, k) if v3 else dense_kernel.tiling(n, k, dtype)
            run.arm(key, "kernel_" + variant, lambda i: dense_kernel.linear(x, weights[i % copies]), x, ref,
                    lambda r: dense_kernel.linear(r, one), nbytes, calls,
                    lambda o=overrides: configured(None, (dense_kernel.CONFIG, o)), splits=splits, k_chunk=k_chunk,
                    tensor_cores=v3, **info)
    del weights


def summarise(run: Runner, counts: collections.Counter, labels: dict, rows_list):
    for (shape, rows), arms in run.times.items():
        kernels = {a: us for a, us in arms.items() if a.startswith("kernel")}
        if kernels:
            best = min(kernels, key=kernels.get)
            emit("DENSE_BEST", shape=shape, rows=rows, arm=best, us=round(kernels[best], 2),
                 vs_cublas=round(arms.get("cublas", math.nan) / kernels[best], 2),
                 vs_per_row=round(arms.get("cublas_per_row", arms.get("cublas", math.nan)) / kernels[best], 2))
    for rows in rows_list:
        rec, complete = {}, True
        for shape_key, count in counts.items():
            arms = run.times.get((labels[shape_key], rows), {})
            per_row_us = arms.get("cublas_per_row", arms.get("cublas"))
            best = min((us for a, us in arms.items() if a.startswith("kernel")), default=None)
            for field, us in (("kernel_default_us", arms.get("kernel_default")),
                              ("kernel_v3_us", arms.get("kernel_v3")), ("kernel_best_us", best),
                              ("cublas_us", arms.get("cublas")), ("cublas_per_row_us", per_row_us)):
                if us is None:
                    complete = False
                else:
                    rec[field] = rec.get(field, 0.0) + count * us
        emit("DENSE_TOKEN", rows=rows, complete=complete, products=sum(counts.values()),
             **{f: round(v, 1) for f, v in rec.items()},
             scope="rank 0, one decode step's dense (bf16/fp32) products; cublas_per_row is today's rows_alone path")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rows", default="1,4,16,32")
    ap.add_argument("--arms", default=".", help="regex over arm names (e.g. 'cublas|kernel_default')")
    ap.add_argument("--shapes", default=".", help="regex over shape names (e.g. 'head|mix')")
    args = ap.parse_args()
    cfg, world = preset("flash"), args.world
    rows_list = [int(r) for r in args.rows.split(",")]
    bw = bandwidth()
    emit("BANDWIDTH", bytes_per_s=bw, device=torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE,
         scope="d2d copy of 2 GiB, read+written")
    counts, labels = token_shapes(cfg, world), names(cfg, world)
    run = Runner(bw, re.compile(args.arms))
    for (n, k, dtype) in counts:
        if re.search(args.shapes, labels[(n, k, dtype)]):
            bench_shape(run, labels[(n, k, dtype)], n, k, dtype, rows_list)
    summarise(run, counts, labels, rows_list)


if __name__ == "__main__":
    main()
