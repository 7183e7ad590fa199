"""Solo decode under the defaults and under other kernel CONFIG settings, interleaved in one process.

A switch's gain on mini is a few percent, and mini's solo decode spreads by as much between processes (session 28:
graph 744-761 tok/s in two calls), so arms are compared in one process: one model, one prefix; per arm its own
states, whose graphs are captured under that arm's CONFIG (dsv4.kernels.<module>.CONFIG, as prefill_batch_bench's
--arm), then rounds of every arm in an ABBA order, each row `steps` tokens from the prefix, the arm's CONFIG set
around each row. On CUDA two kinds a row: the graph arm (model.step, the token read back each step) and the pipelined
arm (dsv4.generation.pipelined_tokens, what generate runs); on CPU the eager step alone (a smoke run). Prints
DECODE_AB_ROW per row and DECODE_AB per arm: median tok/s, its ratio to the defaults' in the same run, the graph's
kernel nodes, the copy bandwidth measured in the same run (CUDA), and whether the arm sampled the defaults' stream
(an arm may change bits: then it says so, it is not an error).

    python benchmarks/decode_ab_bench.py --preset mini --arm fused=attention.fused_combine=1 --steps 64 --rounds 4
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time

import torch

import dsv4
from dsv4.bench import timed_pipelined
from dsv4.gate.timing import timed_steps
from dsv4.generation import pipelined_tokens
from dsv4.measure import copy_bandwidth
from dsv4.receipts import emit, provenance
try:
    from benchmarks.prefill_batch_bench import parse_arm
    from benchmarks.rank_proxy import label, load
except ImportError:  # run as a script without the repository's root on the path
    from prefill_batch_bench import parse_arm
    from rank_proxy import label, load


@contextlib.contextmanager
def settings(sets: list):
    """The arm's (CONFIG, key, value) set within, the values before put back after."""
    before = [(config, key, config[key]) for config, key, _ in sets]
    for config, key, value in sets:
        config[key] = value
    try:
        yield
    finally:
        for config, key, value in before:
            config[key] = value


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="mini")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--arm", action="append", default=[], help="NAME=module.key=value[,module.key=value...]")
    p.add_argument("--prime", type=int, default=64)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--proxy-world", type=int, default=0,
                   help="rank 0 of this many alone on one device (benchmarks/rank_proxy.py)")
    a = p.parse_args()
    arms = [("defaults", [])] + [parse_arm(spec) for spec in a.arm]
    t0 = time.perf_counter()
    model = load(a.preset, a.device, a.proxy_world)
    cuda = model.device.type == "cuda"
    emit("DECODE_AB_BUILD", provenance(model.device, label(a.preset, a.proxy_world)),
         build_s=round(time.perf_counter() - t0, 1),
         arms=[name for name, _ in arms])
    sp = dsv4.SamplingParams(temperature=1.0, seed=20260907)
    prompt = torch.randint(2, model.cfg.vocab_size, (a.prime,), generator=torch.Generator().manual_seed(7)).tolist()
    cap = a.prime + a.steps + 8
    prefix = model.new_state(cap)
    model.prefill(prefix, prompt)
    first = model.draw(prefix, sp)
    kinds = ("graph", "pipelined") if cuda else ("eager",)
    states, nodes = {}, {}
    for name, sets in arms:  # each arm's graphs captured under its own settings
        with settings(sets):
            states[name] = {kind: model.new_state(cap) for kind in kinds}
            if cuda:
                graph, piped = states[name]["graph"], states[name]["pipelined"]
                graph.restore(prefix)
                model.enable_replay(graph, sp)
                model.step(graph, first, sp)
                piped.restore(prefix)
                list(pipelined_tokens(model, piped, first, 2, sp, keep_graph=True))
                nodes[name] = model.graph_census(graph).get("kernel_nodes")
    bandwidth = copy_bandwidth(model.device) if cuda else None
    walls = {(name, kind): [] for name, _ in arms for kind in kinds}
    streams: dict = {name: set() for name, _ in arms}
    for r in range(a.rounds):
        for name, sets in arms if r % 2 == 0 else arms[::-1]:
            with settings(sets):
                for kind in kinds:
                    state = states[name][kind]
                    state.restore(prefix)
                    if kind == "pipelined":
                        drawn, ns = timed_pipelined(model, state, first, a.steps, sp)
                    else:
                        tokens, last, ns = timed_steps(model, state, first, a.steps, sp)
                        drawn = tokens[1:] + [last]
                    walls[name, kind].append(ns / 1e9)
                    streams[name].add(tuple(drawn))
            emit("DECODE_AB_ROW", round=r, arm=name,
                 **{f"{kind}_tok_s": round(a.steps / walls[name, kind][-1], 2) for kind in kinds})
    base = {kind: a.steps / statistics.median(walls["defaults", kind]) for kind in kinds}
    for name, sets in arms:
        rates = {kind: a.steps / statistics.median(walls[name, kind]) for kind in kinds}
        emit("DECODE_AB", provenance(model.device, label(a.preset, a.proxy_world)), arm=name,
             settings={key: value for _, key, value in sets},
             **{f"{kind}_tok_s": round(rate, 2) for kind, rate in rates.items()},
             **{f"{kind}_over_defaults": round(rate / base[kind], 4) for kind, rate in rates.items()},
             kernel_nodes=nodes.get(name), rounds=a.rounds, steps=a.steps, prime=a.prime,
             copy_bandwidth_bytes_per_s=bandwidth, streams=len(streams[name]),
             same_stream_as_defaults=streams[name] == streams["defaults"])
    if any(len(s) != 1 for s in streams.values()):
        sys.stderr.write("decode_ab_bench: an arm sampled different streams in its own rows\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
