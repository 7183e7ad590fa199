"""Batched decode speed (Model.step_batch as a captured graph) at several batch sizes, beside the
single-sequence full-token graph of the same build in the same run.

    python benchmarks/batch_bench.py flash --ranks 2 [--sizes 1 2 4 8 16 32] [--steps 32] [--rows 3]
    python benchmarks/batch_bench.py tiny --device cpu --sizes 1 4 --steps 4 --rows 2   (eager smoke)
    DSV4_KERNELS=triton python benchmarks/batch_bench.py flash --ranks 2 --pool --sizes 1 4 8 16 32

--pool: at each size, the same batch twice: plain states (today's per-sequence attention) and states
that are slots of one dsv4.state.StatePool (`Model.pool_states`): one launch per kernel for every row.
The pooled kernels are not GPU-checked yet, so only DSV4_KERNELS=triton runs them ("auto": the pooled
arm reads the pool through each state's views, per sequence); each record says which arm it is (pool).

For each size B: B states primed from one --prime-token prefix, every row active with its own seed;
the batch graph is captured (untimed), then --rows rows of --steps batched steps are timed; the
median row gives ms per step and aggregate tok/s (B tokens per step). SOLO: one state's full-token
graph (Model.step), timed the same way. One record per line:

  BATCH_BUILD  preset, ranks, device, commit, build wall
  BATCH_SOLO   ms per token and tok/s of the single-sequence graph
  BATCH        B, ms per step, aggregate tok/s, per-sequence tok/s, speedup over SOLO's tok/s, pool
               (with --pool: vs_plain, the pooled arm's tok/s over the plain arm's at the same B)
  BATCH_KERNEL_ROW / _TOTAL   with --profile B: that size's kernels per step and rank (Model.kernel_table_batch)
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import dsv4
from dsv4.receipts import emit, provenance
from dsv4.sampler import SamplingParams


def timed_rows(run_row, rows: int) -> list[float]:
    out = []
    for _ in range(rows):
        start = time.perf_counter()
        run_row()
        out.append(time.perf_counter() - start)
    return out


def batch_point(model, B: int, capacity: int, prefix, prompt, graph: bool, args, pooled: bool = False) -> float:
    """Aggregate tok/s of B fresh states (copies of prefix) stepped together (a graph on CUDA)."""
    states = [model.new_state(capacity) for _ in range(B)]
    for s in states:
        s.restore(prefix)
    samplings = [SamplingParams(temperature=1.0, seed=b) for b in range(B)]
    tokens = [prompt[-1]] * B

    def batch_row():
        nonlocal tokens
        for _ in range(args.steps):
            tokens = list(model.step_batch(states, tokens, samplings, graph=graph))
        model.synchronize()

    batch_row()  # the capture, untimed
    s = statistics.median(timed_rows(batch_row, args.rows))
    if B in args.profile and (pooled or not args.pool):
        for rank, table in enumerate(model.each("kernel_table_batch", states, tokens, samplings, args.profile_steps)):
            for row in table.pop("kernels")[:args.top]:
                emit("BATCH_KERNEL_ROW", rows=B, pool=pooled, rank=rank, **row)
            emit("BATCH_KERNEL_TOTAL", rows=B, pool=pooled, rank=rank, per="step (B tokens)", **table)
    for st in states:
        st.discard()
    model.each("drop_batch_graphs")  # its graph holds the states (and their pool)
    return B * args.steps / s


def batch_record(B: int, tok_s: float, solo_tok_s: float, pooled: bool, args) -> dict:
    return dict(ms_per_step=round(1e3 * B / tok_s, 3), tok_s=round(tok_s, 1), per_sequence_tok_s=round(tok_s / B, 1),
                vs_solo=round(tok_s / solo_tok_s, 2), pool=pooled, steps=args.steps, timed_rows=args.rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("preset")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--prime", type=int, default=64)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--rows", type=int, default=3)
    ap.add_argument("--pool", action="store_true", help="also time each size with pooled states")
    ap.add_argument("--profile", type=int, nargs="*", default=[],
                    help="at these sizes (the pooled arm with --pool) also a kernel table per step and rank")
    ap.add_argument("--profile-steps", type=int, default=8)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    start = time.perf_counter()
    model = dsv4.load(args.preset, device=args.device, ranks=args.ranks)
    graph = model.device.type == "cuda"
    emit("BATCH_BUILD", build_s=round(time.perf_counter() - start, 1), ranks=args.ranks, graph=graph,
         **provenance(model.device, args.preset))
    capacity = args.prime + 8 + args.steps * (args.rows + 1) + (2 * args.profile_steps + 1 if args.profile else 0)
    prompt = [(i * 7919 + 13) % model.cfg.vocab_size for i in range(args.prime)]
    prefix = model.new_state(capacity)
    model.prefill(prefix, prompt)

    solo = model.new_state(capacity)
    solo.restore(prefix)
    sampling = SamplingParams(temperature=1.0, seed=1)
    if graph:
        model.enable_replay(solo, sampling)
    carry = [prompt[-1]]

    def solo_row():
        for _ in range(args.steps):
            carry[0] = model.step(solo, carry[0], sampling)
        model.synchronize()

    solo_row()  # the capture, untimed
    solo_s = statistics.median(timed_rows(solo_row, args.rows))
    solo_tok_s = args.steps / solo_s
    emit("BATCH_SOLO", ms_per_token=round(1e3 * solo_s / args.steps, 3), tok_s=round(solo_tok_s, 1))
    solo.discard()
    del solo

    for B in args.sizes:
        plain = None
        for pooled in ([False, True] if args.pool else [False]):
            model.each("pool_states", B if pooled else 0)
            tok_s = batch_point(model, B, capacity, prefix, prompt, graph, args, pooled)
            extra = dict(vs_plain=round(tok_s / plain, 2)) if pooled else {}
            plain = tok_s
            emit("BATCH", rows=B, **extra, **batch_record(B, tok_s, solo_tok_s, pooled, args))
        model.each("pool_states", 0)
    close = getattr(model, "close", None)
    if close:
        close()


if __name__ == "__main__":
    main()
