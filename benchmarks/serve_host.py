"""Where a served token's time goes between the graph and the HTTP stream (issue 12: concurrency 1 within 10 % of
the single-sequence graph decode). One process, one rank, no HTTP: each arm times --steps tokens, --rows times,
and prints the median ms per token (per round for the scheduler arms):

  SOLO       Model.step on a state with full-token replay (what `dsv4 bench` times)
  BATCH1     Model.step_batch(graph=True) over one state (the server's bucket-1 step, without its scheduler)
  GPU1       the same bucket's graph replayed back to back with no host work between: its device time alone
  SCHED      the server's Scheduler driven in this thread (admit + round), one sequence, no HTTP, no GIL
             contention: what the scheduler itself adds (its rounds pipelined: a step launched before the
             previous one settles; SCHED_SYNC: each step settled before the next)
  SCHED16    the same with 16 sequences (one 16-row step a round), and GPU16 its graph alone
  HOST_TOP   cProfile's top functions by own time over the SCHED arm's rounds

    python benchmarks/serve_host.py --preset mini --device cuda [--gemv v3] [--steps 64] [--rows 3]
    python benchmarks/serve_host.py --preset tiny --device cpu --steps 4 --rows 1   (a CPU smoke: no graphs)
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch

import dsv4
from dsv4.receipts import emit, provenance
from dsv4.sampler import SamplingParams
from dsv4.serve.scheduler import Scheduler, Sequence


def _median_ms(run, rows: int, steps: int, sync) -> tuple[float, list[float]]:
    out = []
    for _ in range(rows):
        sync()
        start = time.perf_counter()
        run()
        sync()
        out.append(1e3 * (time.perf_counter() - start) / steps)
    return statistics.median(out), [round(x, 4) for x in out]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--gemv", choices=["v2", "v3"], default=None)
    ap.add_argument("--prime", type=int, default=64)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rows", type=int, default=3)
    ap.add_argument("--seqs", type=int, default=16)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    if args.gemv:
        from dsv4.kernels import select_gemv

        select_gemv(args.gemv)

    start = time.perf_counter()
    model = dsv4.load(args.preset, device=args.device)
    cuda = model.device.type == "cuda"
    sync = model.synchronize
    emit("SERVE_HOST_BUILD", build_s=round(time.perf_counter() - start, 1),
         **provenance(model.device))
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.cfg.vocab_size, (args.prime,), generator=g).tolist()
    sampling = SamplingParams(temperature=1.0, seed=7)
    # BATCH1 then GPU1 run (2 rows + 1) x steps tokens on one slot after the prompt
    capacity = args.prime + (2 * args.rows + 3) * args.steps + 8

    # SOLO: Model.step with full-token replay
    state = model.new_state(capacity)
    model.prefill(state, prompt[:-1])
    if cuda:
        model.enable_replay(state, sampling)
    tok = [prompt[-1]]

    def solo():
        for _ in range(args.steps):
            tok[0] = model.step(state, tok[0], sampling)

    solo()
    ms, rows = _median_ms(solo, args.rows, args.steps, sync)
    emit("SOLO", ms_per_token=round(ms, 4), rows=rows)
    state.discard()

    # The scheduler's pool (its slots), its bucket graphs captured as the server does before it listens.
    sched = Scheduler(model, max_num_seqs=args.seqs, max_model_len=capacity, max_waiting=64)
    sched.capture_buckets()

    # BATCH1 / GPU1: slot 0 stepped through step_batch as the scheduler's bucket 1 does
    slot = sched.slots[0]
    model.prefill(slot, prompt[:-1])
    tok = [prompt[-1]]

    def batch1():
        for _ in range(args.steps):
            tok[0] = model.step_batch([slot], [tok[0]], [sampling], [True], graph=sched.graphs)[0]

    batch1()
    ms, rows = _median_ms(batch1, args.rows, args.steps, sync)
    emit("BATCH1", ms_per_token=round(ms, 4), rows=rows)
    if cuda:
        batch = next(b for b in model._batches.values() if b.states == [slot] and b.replay is not None
                     and b.replay.graph is not None)
        ms, rows = _median_ms(lambda: [batch.replay.graph.replay() for _ in range(args.steps)], args.rows,
                              args.steps, sync)
        emit("GPU1", ms_per_token=round(ms, 4), rows=rows)
    slot.discard()

    # SCHED: the scheduler's own rounds, one sequence (or --seqs) at a time, in this thread
    def sched_arm(n: int, label: str, profile: bool):
        times: list[list[float]] = [[] for _ in range(n)]
        seqs = [Sequence(list(prompt), args.steps * (args.rows + 1), SamplingParams(temperature=1.0, seed=i),
                         emit=lambda ev, i=i: times[i].append(time.perf_counter()) if ev[0] == "token" else None,
                         ignore_eos=True) for i in range(n)]
        for s in seqs:
            sched.submit(s)
        prof = cProfile.Profile() if profile else None
        rounds = 0
        while sched.running or sched.waiting:
            sched._admit()
            if prof is not None and all(not s.prefilling for s in seqs) and times[0]:
                prof.enable()
            sched._round()
            rounds += 1
            if prof is not None:
                prof.disable()
        # per round after the first --steps tokens of every sequence (warm), medians of --rows windows
        first = args.steps
        spans = []
        for r in range(args.rows):
            a, b = first + r * args.steps, first + (r + 1) * args.steps - 1
            spans.append(1e3 * (times[0][b] - times[0][a]) / (args.steps - 1))
        emit(label, sequences=n, ms_per_round=round(statistics.median(spans), 4), rows=[round(x, 4) for x in spans],
             tokens=sum(len(t) for t in times), rounds=rounds)
        if prof is not None:
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.top)
            for line in out.getvalue().splitlines():
                if line.strip():
                    emit("HOST_TOP", line=line.strip())

    sched_arm(1, "SCHED", profile=False)
    sched_arm(1, "SCHED_PROFILED", profile=True)
    sched_arm(args.seqs, f"SCHED{args.seqs}", profile=False)
    sched.pipelined = False  # the rounds as before session 12: each step settled before the next is launched
    sched_arm(1, "SCHED_SYNC", profile=False)
    sched_arm(args.seqs, f"SCHED{args.seqs}_SYNC", profile=False)
    if cuda:
        size = max(sched.buckets)
        batch = next(b for b in model._batches.values() if len(b.states) == size and b.replay is not None
                     and b.replay.graph is not None and not b.rows.restricted)
        ms, rows = _median_ms(lambda: [batch.replay.graph.replay() for _ in range(args.steps)], args.rows,
                              args.steps, sync)
        emit(f"GPU{size}", ms_per_step=round(ms, 4), rows=rows, note="inactive rows (after the arm): device time only")


if __name__ == "__main__":
    main()
