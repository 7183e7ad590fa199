"""The weights' L2 prefetch (dsv4.kernels.l2_prefetch) measured: solo decode with each budget, in one process.

One model; per arm (a budget in MB a fork point, and the bytes of one prefetch instruction) its own states whose
graphs are captured with that arm's CONFIG (a captured step holds the prefetch launches or not; a replay does what
was captured). Then rounds of every arm in an ABBA order: the graph arm (model.step, the token read back each step)
and the pipelined arm (dsv4.generation.pipelined_tokens, what generate runs), each `steps` tokens from one prefix.
Every arm must sample the same stream (the prefetch changes no value). Prints L2_ROW per row and L2_SUMMARY per arm:
median tok/s, its ratio to the first arm's in the same run, and the copy bandwidth measured in the same run.

    python benchmarks/l2_prefetch_bench.py --preset mini --arms 0 16 32 48 --steps 64 --rounds 4
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import dsv4
from dsv4.gate.timing import sync, timed_steps
from dsv4.generation import pipelined_tokens
from dsv4.kernels import l2_prefetch
from dsv4.measure import copy_bandwidth
from dsv4.receipts import emit, provenance


def arm_config(spec: str) -> dict:
    """"MB[:piece[:site+site...]]" -> l2_prefetch.CONFIG's overrides (sites: of l2_prefetch.SITES)."""
    mb, piece, sites = (spec.split(":") + ["", ""])[:3]
    return {"budget_mb": float(mb), **({"piece": int(piece)} if piece else {}),
            **({"sites": frozenset(sites.split("+"))} if sites else {})}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="mini")
    p.add_argument("--arms", nargs="+", default=["0", "16", "32", "48"])
    p.add_argument("--prime", type=int, default=64)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--rounds", type=int, default=4)
    a = p.parse_args()
    t0 = time.perf_counter()
    model = dsv4.load(a.preset, device="cuda", seed=0)
    emit("L2_BUILD", provenance(model.device, a.preset), build_s=round(time.perf_counter() - t0, 1))
    sp = dsv4.SamplingParams(temperature=1.0, seed=20260907)
    prompt = torch.randint(2, model.cfg.vocab_size, (a.prime,), generator=torch.Generator().manual_seed(7)).tolist()
    cap = a.prime + a.steps + 8
    prefix = model.new_state(cap)
    model.prefill(prefix, prompt)
    first = model.draw(prefix, sp)
    default = dict(l2_prefetch.CONFIG)
    states = {}
    for spec in a.arms:  # each arm's graphs captured under its own CONFIG
        l2_prefetch.CONFIG.update(default, **arm_config(spec))
        graph, piped = model.new_state(cap), model.new_state(cap)
        graph.restore(prefix)
        model.enable_replay(graph, sp)
        model.step(graph, first, sp)
        piped.restore(prefix)
        list(pipelined_tokens(model, piped, first, 2, sp, keep_graph=True))
        states[spec] = (graph, piped, model.graph_census(graph).get("kernel_nodes"))
    l2_prefetch.CONFIG.update(default)
    bandwidth = copy_bandwidth(model.device)
    walls = {(spec, kind): [] for spec in a.arms for kind in ("graph", "pipelined")}
    streams = set()
    for r in range(a.rounds):
        order = a.arms if r % 2 == 0 else a.arms[::-1]
        for spec in order:
            graph, piped, _ = states[spec]
            graph.restore(prefix)
            tokens, last, ns = timed_steps(model, graph, first, a.steps, sp)
            walls[spec, "graph"].append(ns / 1e9)
            streams.add(tuple(tokens[1:] + [last]))
            piped.restore(prefix)
            sync(model)
            start = time.perf_counter_ns()
            drawn = list(pipelined_tokens(model, piped, first, a.steps, sp, keep_graph=True))
            sync(model)
            walls[spec, "pipelined"].append((time.perf_counter_ns() - start) / 1e9)
            streams.add(tuple(drawn))
            emit("L2_ROW", round=r, arm=spec, graph_tok_s=round(a.steps / walls[spec, "graph"][-1], 2),
                 pipelined_tok_s=round(a.steps / walls[spec, "pipelined"][-1], 2))
    base = {kind: a.steps / statistics.median(walls[a.arms[0], kind]) for kind in ("graph", "pipelined")}
    for spec in a.arms:
        g = a.steps / statistics.median(walls[spec, "graph"])
        pp = a.steps / statistics.median(walls[spec, "pipelined"])
        emit("L2_SUMMARY", provenance(model.device, a.preset), arm=spec, config={k: sorted(v) if isinstance(v, frozenset) else v for k, v in arm_config(spec).items()},
             graph_tok_s=round(g, 2), pipelined_tok_s=round(pp, 2),
             graph_over_first=round(g / base["graph"], 4), pipelined_over_first=round(pp / base["pipelined"], 4),
             kernel_nodes=states[spec][2], rounds=a.rounds, steps=a.steps, prime=a.prime,
             copy_bandwidth_bytes_per_s=bandwidth, same_stream=len(streams) == 1)
    if len(streams) != 1:
        raise SystemExit(f"l2_prefetch_bench: the arms sampled {len(streams)} different streams")


if __name__ == "__main__":
    main()
