"""Where a decode token's time goes, kernel by kernel: the replayed graph and the eager step, per rank.

    python benchmarks/kernel_table.py --preset mini --device cuda [--steps 16] [--top 40] [--out FILE]
    python benchmarks/kernel_table.py --preset flash --device cuda --ranks 2
    python benchmarks/kernel_table.py --preset tiny --device cpu --steps 2     # smoke run (CPU ops)

One load. Prime `--prime` tokens, then on each rank (Model.kernel_table, dsv4.measure): `--steps`
steps timed plainly and `--steps` more under torch.profiler, first replaying the full-token graph
(captured once, outside the timed steps), then eager from the same prefix. Records (dsv4.receipts):

  KERNEL_ROW    arm, rank, kernel name (shortened), calls and GPU us per token, share of the arm's
                kernel time; on CUDA its advance (dsv4.measure.advances: the time by which it moved
                the stream forward; additive under PDL, where durations overlap); the `--top` largest
  KERNEL_SEQ    (--sequence, CUDA) the last token's activities in launch order: start, duration, advance
  KERNEL_TOTAL  arm, rank, kernels (nodes) per token, their summed GPU us per token, the wall ms per
                token without the profiler, busy_fraction = kernel time / wall (the rest is launch
                overhead and idle), the graph's census (rank 0's), provenance

A collective's kernel time includes its wait for the other rank (in eager steps, for that rank's
host to launch it): read the graph arm for what the GPU spends.

On CPU there is no graph arm, and the rows are the top-level torch ops with their host time.
"""

from __future__ import annotations

import argparse

import dsv4
from dsv4.bench import PROMPT
from dsv4.receipts import Receipts, provenance
try:
    from benchmarks.rank_proxy import label, load
except ImportError:  # run as a script without the repository's root on the path
    from rank_proxy import label, load


def arm_states(model, prefix, first: int, sp, graph_arm: bool):
    """(arm, state, carry token) ready to step: the graph arm captured already, outside the measured steps."""
    if graph_arm:
        graph = model.new_state(prefix.capacity)
        graph.restore(prefix)
        model.enable_replay(graph, sp)
        carry = model.step(graph, first, sp)  # the capture and the census's first replay
        yield "graph", graph, carry
    eager = model.new_state(prefix.capacity)
    eager.restore(prefix)
    yield "eager", eager, first


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--model", default=None, help="a checkpoint directory instead of --preset")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--proxy-world", type=int, default=0,
                    help="rank 0 of this many alone on one device (benchmarks/rank_proxy.py), instead of --ranks")
    ap.add_argument("--prime", type=int, default=64)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--out", default=None, help="also write the records to this file")
    ap.add_argument("--sequence", action="store_true",
                    help="CUDA: also the last token's activities in launch order (KERNEL_SEQ)")
    args = ap.parse_args(argv)
    receipts = Receipts(args.out)
    if args.proxy_world and (args.model or args.ranks != 1):
        ap.error("--proxy-world takes a --preset and one rank")
    model = load(args.preset, args.device, args.proxy_world) if args.proxy_world else \
        dsv4.load(args.model or args.preset, device=args.device, ranks=args.ranks, seed=0)
    try:
        sp = dsv4.SamplingParams(temperature=1.0, seed=20260907)
        text = model.tokenizer.encode(PROMPT)
        prompt = (text * (args.prime // len(text) + 1))[:args.prime]
        prefix = model.new_state(args.prime + 2 * args.steps + 8)
        model.prefill(prefix, prompt)
        first = model.draw(prefix, sp)
        where = provenance(model.device, args.model or label(args.preset, args.proxy_world))
        for arm, state, carry in arm_states(model, prefix, first, sp, model.device.type == "cuda"):
            for rank, table in enumerate(model.each("kernel_table", state, carry, sp, args.steps)):
                rows = table.pop("kernels")
                sequence = table.pop("sequence", [])
                for row in rows[:args.top]:
                    receipts.emit("KERNEL_ROW", arm=arm, rank=rank, **row)
                if args.sequence:
                    for row in sequence:
                        receipts.emit("KERNEL_SEQ", arm=arm, rank=rank, **row)
                census = model.graph_census(state) if arm == "graph" else {}
                receipts.emit("KERNEL_TOTAL", where, arm=arm, rank=rank, ranks=model.world, prime=args.prime,
                              steps=args.steps, **table, graph_census=census)
    finally:
        if hasattr(model, "close"):
            model.close()
        receipts.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
