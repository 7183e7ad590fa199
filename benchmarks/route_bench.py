"""The MoE router's kernel (dsv4.kernels.route) after the gate's GEMV, at Flash's shapes, with DSV4_PDL off or on.

    PYTHONPATH=$PWD python benchmarks/route_bench.py [--rows 1,4]

A top-k layer's router: the gate's logits (dense.linear on the stored bf16 weight [256, 4096]: dense's kernel), then
the router's kernel over them and the layer's bias (fp32 [256]). With DSV4_PDL=1 (read at import: one process per
setting) the router is launched with launch_pdl and loads its bias before it waits for the gate's GEMV, which itself
fetches its first weight tile before it waits. Arms, each captured as `calls` calls in one CUDA graph and replayed
(benchmarks/qgemv_bench.py's timing: median microseconds per call):
  gate        the gate's GEMV alone
  gate_route  the GEMV, then the router: a layer's pair; the calls rotate over copies of the weight and bias (at
              least 256 MiB), so that each call finds neither in L2, as in a step where each layer has its own
  route       the router alone, back to back over the same logits (its bias copies fit in L2: the launch alone)
gate_route's us minus gate's is the router's share of a layer. digest: sha256 of the arm's outputs' bytes (the
inputs are seeded: DSV4_PDL=0 and =1 give equal digests where the bits are equal).

One GPU, under a minute. Prints ROUTE {"rows", "arm", "us", "launches", "pdl", "digest", "ids_equal"}; ids_equal:
the router's ids equal the torch reference's from the same logits (dsv4.model.moe._route).
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.qgemv_bench import configured, digest, launches, timed
from dsv4 import kernels
from dsv4.config import preset
from dsv4.kernels import dense
from dsv4.kernels import route as fused
from dsv4.model import moe
from dsv4.receipts import emit

L2_DEFEAT = 256 << 20
DEVICE = "cuda"


def bench(cfg, rows: int):
    E, D, k = cfg.n_routed_experts, cfg.hidden_size, cfg.num_experts_per_tok
    copies = max(1, L2_DEFEAT // (2 * E * D))
    g = torch.Generator(device=DEVICE).manual_seed(rows)
    x = torch.randn(rows, D, generator=g, device=DEVICE).bfloat16()
    weights = [(torch.randn(E, D, generator=g, device=DEVICE) * D ** -0.5).bfloat16() for _ in range(copies)]
    biases = [torch.randn(E, generator=g, device=DEVICE) * 0.1 for _ in range(copies)]
    tokens = torch.zeros(rows, dtype=torch.int64, device=DEVICE)
    logits = dense.linear(x, weights[0], stored=True)

    def gate(i):
        return dense.linear(x, weights[i], stored=True)

    def router(logits_i, i):
        return fused.route(logits_i, tokens, biases[i], None, k, cfg.norm_topk_prob, cfg.routed_scaling_factor)

    arms = {"gate": (gate, copies), "gate_route": (lambda i: router(gate(i), i), copies),
            "route": (lambda i: router(logits, i % copies), 256)}
    ref_ids, _ = moe._route(logits, tokens, {"bias": biases[0]}, cfg)  # the reference from the same logits
    for arm, (fn, calls) in arms.items():
        with configured("triton"):
            got = fn(0)
            got = got if isinstance(got, tuple) else (got,)
            torch.cuda.synchronize()
            record = dict(rows=rows, arm=arm, us=round(timed(fn, calls), 2), launches=launches(lambda: fn(0)),
                          pdl=kernels.PDL, digest=digest(got))
        if arm == "gate_route":
            record["ids_equal"] = torch.equal(got[0], ref_ids)
        emit("ROUTE", record)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,4")
    args = ap.parse_args()
    cfg = preset("flash")
    emit("DEVICE", name=torch.cuda.get_device_name(), experts=cfg.n_routed_experts, D=cfg.hidden_size,
         topk=cfg.num_experts_per_tok, pdl=kernels.PDL)
    with torch.inference_mode():
        for rows in (int(r) for r in args.rows.split(",")):
            bench(cfg, rows)


if __name__ == "__main__":
    main()
