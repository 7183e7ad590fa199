"""qgemv's v2 against the TMA-fed FP8 GEMV (dsv4.kernels.qgemv_tma, DSV4_QGEMV_TMA) on one Flash layer's stored FP8
weights of rank 0 over --world ranks, at 1 row and a batched step's rows, with the copy bandwidth measured in the
same run (benchmarks/qgemv_bench.py's timing: `calls` calls in one CUDA graph over copies of the weight that
defeat the L2, median of 10 replays).

Each arm is checked before it is timed: max_rel_err against the dequantise + GEMM reference (qgemv_bench's
TOLERANCE), rows_exact (each row of a batched launch equal, bit for bit, to that row launched alone under the
same arm) and deterministic (two launches, the same bits).

Prints BANDWIDTH, QGEMV per shape x rows x arm, QGEMV_LAYER per rows x arm (the layer's FP8 linears summed, each
once) and QGEMV_TMA_BEST per rows (the fastest TMA arm against v2 over the layer).
"""

from __future__ import annotations

import argparse
import re

import torch
import torch.nn.functional as F

from benchmarks.qgemv_bench import Runner, bandwidth, configured, dense_shapes, l2_defeating_weights
from dsv4.config import preset
from dsv4.kernels import qgemv, qgemv_tma
from dsv4.receipts import emit

ARMS = {"v2": {"on": False}}  # qgemv_tma.CONFIG overrides
for block_n, stages in ((16, 4), (16, 8), (16, 16), (32, 4), (32, 8), (64, 2), (64, 4), (8, 16)):
    ARMS[f"tma_n{block_n}_s{stages}"] = {"on": True, "block_n": block_n, "stages": stages}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--rows", default="1,4")
    ap.add_argument("--arms", default=".", help="regex over arm names")
    args = ap.parse_args()
    cfg = preset("flash")
    bw = bandwidth()
    emit("BANDWIDTH", bytes_per_s=bw, device=torch.cuda.get_device_name())
    run = Runner(bw, re.compile(args.arms))
    groups = cfg.o_groups // args.world
    rows_list = [int(r) for r in args.rows.split(",")]
    names = []
    for name, fmt, n, k, kind in dense_shapes(cfg, args.world):
        if fmt != "fp8" or name in ("shared.w1", "shared.w3"):  # the shared gate/up run in moe_gl's kernel 1
            continue
        names.append(name)
        weights, nbytes, copies, calls = l2_defeating_weights(fmt, n, k)
        one = weights[0]
        gx = groups if kind == "grouped" else 1

        def product(x, wt):
            return qgemv.grouped_linear(x, wt, gx) if kind == "grouped" else qgemv.linear(x, wt)

        for rows in rows_list:
            x = torch.randn(rows, k * gx, device="cuda", dtype=torch.bfloat16)
            wt = one.dequant(torch.bfloat16)
            if kind == "grouped":
                expected = torch.einsum("tgi,goi->tgo", x.view(rows, gx, -1), wt.view(gx, n // gx, -1)).flatten(1)
            else:
                expected = F.linear(x, wt)
            for arm, overrides in ARMS.items():
                if not run.arms.search(arm):
                    continue

                def context(o=overrides):
                    return configured(None, (qgemv.CONFIG, {"kernel": "v2"}), (qgemv_tma.CONFIG, o))

                try:
                    with context():
                        alone = torch.cat([product(x[r:r + 1], one) for r in range(rows)])
                        first = product(x, one)
                        exact, deterministic = torch.equal(first, alone), torch.equal(first, product(x, one))
                except Exception as e:  # noqa: BLE001
                    emit("QGEMV", shape=f"{name} x{rows}", variant=arm, error=f"{type(e).__name__}: {str(e)[:300]}")
                    continue
                run.arm(f"{name} x{rows}", arm, lambda i, x=x: product(x, weights[i % copies]), expected, nbytes,
                        calls, context, rows_exact=exact, deterministic=deterministic, N=n, K=k, kind=kind,
                        rows=rows)
        del weights
    for rows in rows_list:
        layer = {}
        for arm in ARMS:
            times = [run.times.get(f"{name} x{rows}", {}).get(arm) for name in names]
            if None in times:
                continue
            nbytes = sum(run.bytes[f"{name} x{rows}"] for name in names)
            layer[arm] = sum(times)
            emit("QGEMV_LAYER", rows=rows, variant=arm, us=round(layer[arm], 2), layer_bytes=nbytes,
                 fraction=round(nbytes / (layer[arm] * 1e-6) / bw, 3), shapes=names, world=args.world)
        tma = {a: us for a, us in layer.items() if a != "v2"}
        if tma and "v2" in layer:
            best = min(tma, key=tma.get)
            emit("QGEMV_TMA_BEST", rows=rows, arm=best, us=round(tma[best], 2), v2_us=round(layer["v2"], 2),
                 speedup=round(layer["v2"] / tma[best], 3))


if __name__ == "__main__":
    main()
