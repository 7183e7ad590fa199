"""Where a Flash rank's experts' kernels spend their time inside the decode graph: every program's start, wait and end.

benchmarks/rank_proxy.py's rank (rank 0 of --world alone on one GPU), its decode graph captured with dsv4.kernels.moe_gl
CONFIG stamps on (each program of a one-token step's kernel 1 and kernel 2 writes %globaltimer at its start, after its
wait for the kernel before (kernel 1's routed programs), and at its end, with its kind: the shared expert's, a local
pair's, another rank's pair's), then --steps replays. Of the last replay, per layer (times in us from kernel 1's first
program start):

    MOE_STAMPS {"layer", "k1": {"wait": the routed programs' first release, "shared_end", "local_start" (quantiles of
                the local programs' release, after "wait"), "local_us" (their median duration after the release),
                "end"}, "k2": {"start", "local_us", "end"}}

and MOE_STAMPS_SUMMARY with the medians over the layers. Kernel 1's end less its release is the advance a token's
layer pays for it (session 43's sequence: 15-19 us); the quantiles say whether the local programs start at the release
(one wave) or later (a second wave behind the other programs), and how long one program takes.

    python benchmarks/moe_stamps.py [--world 2] [--steps 4]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from dsv4.kernels import moe_gl
from dsv4.receipts import emit, provenance
from dsv4.sampler import SamplingParams
try:
    from benchmarks.rank_proxy import build_proxy, label
except ImportError:  # run as a script without the repository's root on the path
    from rank_proxy import build_proxy, label


def quantiles(values: list[float]) -> list[float]:
    """(min, 25 %, median, 75 %, max), rounded to 0.01 us."""
    if not values:
        return []
    v = sorted(values)
    return [round(v[int(q * (len(v) - 1))], 2) for q in (0, 0.25, 0.5, 0.75, 1)]


def layer_record(k1: torch.Tensor, k2: torch.Tensor) -> dict:
    """One layer's programs' stamps [programs, 4] (ns; kind 1 shared, 2 local, 3 another rank's; rows never written
    are zeros) -> the figures the module's doc names, us from kernel 1's first start."""
    k1 = k1[k1[:, 0] > 0].double()
    k2 = k2[k2[:, 0] > 0].double()
    zero = float(k1[:, 0].min())
    us = lambda t: (t - zero) / 1e3  # noqa: E731
    shared, local, routed = k1[k1[:, 3] == 1], k1[k1[:, 3] == 2], k1[k1[:, 3] >= 2]
    wait = float(routed[:, 1].min())
    k2_local = k2[k2[:, 3] == 2]
    return {"k1": {"programs": int(k1.shape[0]), "local": int(local.shape[0]), "wait": round(us(wait), 2),
                   "shared_end": round(us(float(shared[:, 2].max())), 2) if len(shared) else None,
                   "local_start": quantiles([(float(t) - wait) / 1e3 for t in local[:, 1]]),
                   "local_us": round(statistics.median(((local[:, 2] - local[:, 1]) / 1e3).tolist()), 2)
                   if len(local) else None,
                   "end": round(us(float(k1[:, 2].max())), 2)},
            "k2": {"programs": int(k2.shape[0]), "local": int(k2_local.shape[0]),
                   "start": round(us(float(k2[:, 0].min())), 2),
                   "local_us": round(statistics.median(((k2_local[:, 2] - k2_local[:, 0]) / 1e3).tolist()), 2)
                   if len(k2_local) else None, "end": round(us(float(k2[:, 2].max())), 2)}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="flash")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4, help="graph replays (the last one's stamps are read)")
    args = ap.parse_args()
    device = torch.device("cuda")
    model = build_proxy(args.preset, args.world, 0, device)
    layers = model.cfg.num_hidden_layers
    stamps = {"k1": torch.zeros(layers, 2048, 4, dtype=torch.int64, device=device),
              "k2": torch.zeros(layers, 2048, 4, dtype=torch.int64, device=device),
              "slots": layers, "next": {"k1": 0, "k2": 0}}
    sp = SamplingParams(temperature=1.0, seed=1)
    state = model.new_state(64 + args.steps + 16)
    model.prefill(state, list(range(1, 65)))
    tok = model.draw(state, sp)
    moe_gl.CONFIG["stamps"] = stamps  # a one-token step's launches from here on, the capture's included
    try:
        model.enable_replay(state, sp)
        for _ in range(args.steps):
            tok = model.step(state, tok, sp)
        torch.cuda.synchronize()
    finally:
        moe_gl.CONFIG["stamps"] = None
    if stamps["next"]["k1"] % layers or stamps["next"]["k2"] % layers:
        raise SystemExit(f"moe_stamps: {stamps['next']} launches, not a multiple of the {layers} layers")
    k1, k2 = stamps["k1"].cpu(), stamps["k2"].cpu()
    records = []
    for layer in range(layers):
        rec = layer_record(k1[layer], k2[layer])
        records.append(rec)
        emit("MOE_STAMPS", layer=layer, **rec)
    def med(kernel, key, i=None):  # over the layers with local pairs
        values = [r[kernel][key] if i is None else r[kernel][key][i] for r in records if r[kernel]["local"]]
        return round(statistics.median(values), 2)

    emit("MOE_STAMPS_SUMMARY", provenance(device, label(args.preset, args.world)), layers=layers,
         k1_wait=med("k1", "wait"), k1_end=med("k1", "end"), k1_local_us=med("k1", "local_us"),
         k1_local_start_median=med("k1", "local_start", 2), k1_local_start_max=med("k1", "local_start", 4),
         k2_start=med("k2", "start"), k2_end=med("k2", "end"), k2_local_us=med("k2", "local_us"),
         scope="the last replay of the rank's decode graph; us from kernel 1's first program start, medians over layers")


if __name__ == "__main__":
    main()
