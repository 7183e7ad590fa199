"""The mHC boundary in one launch (dsv4.kernels.hc_boundary) against the launches it replaces, at Flash's shapes.

    PYTHONPATH=$PWD python benchmarks/hc_boundary_bench.py [--rows 1,4,16] [--arms REGEX]

A decode step crosses 2 * 43 boundaries per token (hc 4, D 4096, bf16 streams, fp32 hc_fn [24, 16384] and
norm weights). Arms, for each boundary kind ("mid": a sublayer's output into the streams, then the next
sublayer's maps and normed input; "first": the embedded row into the streams of layer 0):
  unfused            what DSV4_KERNELS=triton ran before: hc_post, the fp32 copy, the mix GEMV (dense.py),
                     hc.py's pre kernel, rms_norm (the first boundary: the copy into the streams, then the same)
  unfused_fused_sum  the same with the GEMV's split sum in its own launch (dense CONFIG fused_sum)
  fused_<variant>    hc_boundary.boundary under a CONFIG override of VARIANTS
Each arm is captured as `calls` calls in one CUDA graph and replayed (benchmarks/qgemv_bench.py's timing:
median microseconds per call); the calls rotate over copies of hc_fn, at least 256 MiB of them, so that no
call finds its weight in L2, as in a step where each boundary has its own. Each call follows a kernel (the call
before it): with DSV4_PDL=1 (read at import: one process per setting; `pdl` in the records) a fused call fetches
its hc_fn slice while the call before it runs. Before timing: max_rel_err of
each output against the unfused arm (largest difference over the largest magnitude; the streams must be
equal), rows_exact (each row of the all-rows launch equals that row launched alone, bit for bit),
tickets_zero (the tickets are back at 0), default_bits (a fused arm's outputs equal fused_default's, bit for bit:
the finish options one_pass and warp_maps may change them), digest (sha256 of the arm's outputs' bytes: the inputs
are seeded, so two processes, DSV4_PDL=0 and =1, give equal digests where the bits are equal) and launches
(kernels per call, by the profiler).

--sinkhorn-iters N,M,... (a diagnostic, not the model): fused_default again at these Sinkhorn iteration counts
(arms fused_default_iters<N>; the model's hc_sinkhorn_iters is Flash's config), so that the finish's Sinkhorn
latency is read off the difference (the maps' serial chain inside the boundary's one finishing program).

One GPU, about a minute (Triton compiles each variant once). Prints:
  HC_BOUNDARY {"boundary", "rows", "arm", "us", "launches", "max_rel_err", "rows_exact", "tickets_zero", "pdl",
               "digest", ...}
  HC_BOUNDARY_TOKEN {"rows", "arm", "us_per_token", "launches_per_token"} per rows: 2 * layers - 1 mid
    boundaries and the first, for unfused and the best fused variant
"""

from __future__ import annotations

import argparse
import dataclasses
import re

import torch

from benchmarks.qgemv_bench import configured, digest, launches, timed
from dsv4 import kernels
from dsv4.config import preset
from dsv4.kernels import dense, qgemv
from dsv4.kernels import hc_boundary as fused
from dsv4.model import hc, norm
from dsv4.model.rows import rows_alone
from dsv4.receipts import emit

VARIANTS = {  # hc_boundary.CONFIG overrides (tests/compile_kernels.py compiles each)
    "default": {},
    "d16": {"block_d": 16},
    "d64": {"block_d": 64},
    "d128_w8_r2048": {"block_d": 128, "num_warps": 8, "block_r": 2048},
    "one_pass": {"one_pass_finish": True},
    "warp_maps": {"warp_maps": True},
    "one_pass_warp_maps": {"one_pass_finish": True, "warp_maps": True},
}
L2_DEFEAT = 256 << 20
DEVICE = "cuda"


def inputs(cfg, rows: int, copies: int, gen) -> dict:
    hc_mult, D = cfg.hc_mult, cfg.hidden_size
    n = (2 + hc_mult) * hc_mult

    def rand(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen, device=DEVICE) * scale

    return dict(out=rand(rows, D).bfloat16(), h=rand(rows, hc_mult, D).bfloat16(),
                post=2 * torch.rand(rows, hc_mult, generator=gen, device=DEVICE),
                comb=torch.softmax(rand(rows, hc_mult, hc_mult), -1),
                fns=[rand(n, hc_mult * D, scale=0.05) for _ in range(copies)], base=rand(n, scale=0.1),
                scale=torch.rand(3, generator=gen, device=DEVICE),
                norm_w=torch.rand(D, generator=gen, device=DEVICE) + 0.5)


def unfused(a, i, cfg, first: bool):
    """The launches the forward ran before (its reference chain under DSV4_KERNELS=triton, rows alone)."""
    with rows_alone():
        if first:
            h = a["out"].unsqueeze(1).expand(-1, cfg.hc_mult, -1).contiguous()
        else:
            h = hc.hc_post(a["out"], a["post"], a["comb"], a["h"])
        post, comb, collapsed = hc.hc_pre(h, a["fns"][i], a["base"], a["scale"], cfg)
        return h, post, comb, norm.rms_norm(collapsed, a["norm_w"], cfg.rms_norm_eps)


def one_launch(a, i, cfg, first: bool):
    return fused.boundary(a["out"], a["post"], a["comb"], None if first else a["h"], a["fns"][i], a["base"],
                          a["scale"], a["norm_w"], cfg.hc_mult, cfg.hc_sinkhorn_iters, cfg.rms_norm_eps, cfg.hc_eps)


def _at_iters(n: int):
    """one_launch with the config's Sinkhorn iterations replaced by n (--sinkhorn-iters: a diagnostic)."""
    return lambda a, i, cfg, first: one_launch(a, i, dataclasses.replace(cfg, hc_sinkhorn_iters=n), first)


def rel_err(got, ref) -> float:
    got, ref = got.float(), ref.float()
    return float((got - ref).abs().max() / ref.abs().max())


def rows_exact(a, cfg, first: bool) -> bool:
    batch = one_launch(a, 0, cfg, first)
    per_row = ("out", "post", "comb", "h")
    for r in range(a["out"].shape[0]):
        alone = one_launch({k: v[r:r + 1] if k in per_row else v for k, v in a.items()}, 0, cfg, first)
        if not all(torch.equal(x, y[r:r + 1]) for x, y in zip(alone, batch)):
            return False
    return True


def bench(cfg, kind: str, rows: int, arms: re.Pattern, results: dict, iters=()):
    first = kind == "first"
    copies = max(1, L2_DEFEAT // (4 * (2 + cfg.hc_mult) * cfg.hc_mult ** 2 * cfg.hidden_size))
    a = inputs(cfg, rows, copies, torch.Generator(device=DEVICE).manual_seed(rows))
    with configured("triton"):
        ref = unfused(a, 0, cfg, first)
    with configured("triton", (fused.CONFIG, {"one_pass_finish": False, "warp_maps": False})):
        default = one_launch(a, 0, cfg, first)
    plans = [("unfused", unfused, ()), ("unfused_fused_sum", unfused, ((dense.CONFIG, {"fused_sum": True}),))]
    plans += [(f"fused_{name}", one_launch, ((fused.CONFIG, over),)) for name, over in VARIANTS.items()]
    plans += [(f"fused_default_iters{n}", _at_iters(n), ()) for n in iters]
    for arm, fn, overrides in plans:
        if not arms.search(arm):
            continue
        record = dict(boundary=kind, rows=rows, arm=arm, pdl=kernels.PDL)
        try:
            with configured("triton", *overrides):
                got = fn(a, 0, cfg, first)
                torch.cuda.synchronize()
                record["launches"] = launches(lambda: fn(a, 0, cfg, first))
                record["us"] = round(timed(lambda i: fn(a, i, cfg, first), copies), 2)
                if fn is one_launch or arm.startswith("fused_default_iters"):
                    record["rows_exact"] = rows_exact(a, cfg, first)
                    record["tickets_zero"] = not bool(qgemv.tickets_for(rows, torch.device(DEVICE)).any())
                    record["default_bits"] = all(torch.equal(x, y) for x, y in zip(got, default))
        except Exception as e:  # a variant that fails to build or run: recorded, the others still run
            emit("HC_BOUNDARY", record, error=f"{type(e).__name__}: {str(e)[:300]}")
            continue
        record["digest"] = digest(got)
        record["streams_equal"] = torch.equal(got[0], ref[0])
        record["max_rel_err"] = {name: rel_err(x, y)
                                 for name, x, y in zip(("post", "comb", "normed"), got[1:], ref[1:])}
        emit("HC_BOUNDARY", record)
        results[(kind, rows, arm)] = record


def summarise(cfg, results: dict, rows_list):
    mids = 2 * cfg.num_hidden_layers - 1
    for rows in rows_list:
        fused_arms = [arm for (kind, r, arm), rec in results.items() if kind == "mid" and r == rows
                      and arm.startswith("fused_") and rec.get("rows_exact") and rec.get("streams_equal")]
        best = min(fused_arms, key=lambda arm: results[("mid", rows, arm)]["us"], default=None)
        for arm in ("unfused", best):
            mid, first = results.get(("mid", rows, arm)), results.get(("first", rows, arm))
            if arm is None or mid is None or first is None:
                continue
            emit("HC_BOUNDARY_TOKEN", rows=rows, arm=arm, us_per_token=round(mids * mid["us"] + first["us"], 1),
                 launches_per_token=None if mid["launches"] is None else mids * mid["launches"] + first["launches"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,4,16")
    ap.add_argument("--arms", default=".", help="regex over arm names (e.g. 'unfused$|fused_default')")
    ap.add_argument("--sinkhorn-iters", default="", help="N,M,...: fused_default at these iteration counts too")
    args = ap.parse_args()
    cfg, rows_list = preset("flash"), [int(r) for r in args.rows.split(",")]
    emit("DEVICE", name=torch.cuda.get_device_name(), hc=cfg.hc_mult, D=cfg.hidden_size, layers=cfg.num_hidden_layers)
    results: dict = {}
    with torch.inference_mode():
        for rows in rows_list:
            for kind in ("mid", "first"):
                bench(cfg, kind, rows, re.compile(args.arms), results,
                      [int(n) for n in args.sinkhorn_iters.split(",") if n])
    summarise(cfg, results, rows_list)


if __name__ == "__main__":
    main()
