"""One FP8 linear of a given shape through qgemv, launched a few times with CONFIG overrides: a target for a
kernel profiler (ncu) that should see that launch and no other.

    ncu --clock-control none --kernel-name regex:qgemv3 --launch-skip 2 --launch-count 1 --section SpeedOfLight \\
        python benchmarks/qgemv_one.py --n 4096 --k 4096 --rows 1 --set kernel=v3 --set v3_walk=128
"""

from __future__ import annotations

import argparse

import torch

from dsv4.formats import QWeight
from dsv4.kernels import qgemv
from dsv4.receipts import emit, provenance


def apply_sets(items: list[str], config: dict, name: str) -> None:
    """--set key=value items into config (ints where they parse); a key config lacks is an error naming it."""
    for item in items:
        key, value = item.split("=", 1)
        if key not in config:
            raise SystemExit(f"--set {item}: {name} CONFIG has no key {key!r}")
        config[key] = int(value) if value.lstrip("-").isdigit() else value


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, required=True, help="outputs")
    ap.add_argument("--k", type=int, required=True, help="inputs (a multiple of 128)")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--launches", type=int, default=5)
    ap.add_argument("--set", action="append", default=[], help="qgemv CONFIG key=value (ints where they parse)")
    args = ap.parse_args()
    apply_sets(args.set, qgemv.CONFIG, "qgemv")
    g = torch.Generator(device="cuda").manual_seed(0)
    data = torch.randn(args.n, args.k, device="cuda", generator=g).to(torch.float8_e4m3fn)
    scale = torch.full((-(-args.n // 128), args.k // 128), 127, dtype=torch.uint8, device="cuda")
    w = QWeight(data, scale.view(torch.float8_e8m0fnu), "fp8")
    x = torch.randn(args.rows, args.k, device="cuda", dtype=torch.bfloat16, generator=g)
    for _ in range(args.launches):
        y = qgemv.linear(x, w)
    torch.cuda.synchronize()
    emit("QGEMV_ONE", provenance("cuda"), n=args.n, k=args.k, rows=args.rows, launches=args.launches,
         config=dict(qgemv.CONFIG), abs_sum=float(y.float().abs().sum()))


if __name__ == "__main__":
    main()
