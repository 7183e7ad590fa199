"""`dsv4 bench`: decode speed of the plain (eager) step against full-token graph replay.

One load. Prime a deterministic prompt, then rows of `steps` sampled steps from the same restored
prefix, alternating arms ABBA (eager, graph, graph, eager, ...), each timed end to end
(model.step: forward, commit, head, sampling, readback) with the gate's timing
(dsv4.gate.timing). On CUDA each graph row is followed by a pipelined row: the one-row batch graph with
one step in flight (dsv4.generation.pipelined_tokens: the next step launched, its input token read on
the device, before this one's token reaches the host), which is how `generate` decodes on CUDA.
Prints JSON records (dsv4.receipts), provenance included:

  BENCH_BUILD    load wall, device, ranks, dtype, memory per rank
  BENCH_ROW      one row: arm and tok/s
  BENCH_SUMMARY  median tok/s per arm, their ratios, whether every row sampled the same stream,
                 all-reduces per token per rank (census), the graph's census and captures, and
                 on CUDA the launches of one step of each arm on rank 0 (torch.profiler: CUDA
                 kernels and copies; eager launches its kernels one by one, the graph replays them)
  BENCH_PREFILL  (--prefill N[,M...]) per prompt length: the median wall of its prefill, tokens a second
  BENCH_PROFILE  (--profile) per rank: us per token of each phase of the step from the prefix, timed inside
                 a replayed CUDA graph (CPU: eager steps), against the plain graph; bytes read, the roofline

On CPU there is no graph arm: every row runs the eager step and is labelled "eager" (twice the rows
of one arm). Exit 1 when rows sampled different streams (the replay is then wrong, and its speed
means nothing).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from .gate.timing import arms, sync, timed_steps
from .generation import pipelined_tokens
from .receipts import emit, provenance
from .sampler import SamplingParams

PROMPT = "The engine that people who run DeepSeek-V4 on their own GPUs reach for first."


def run_bench(model, prime: int, steps: int, rows: int, build_s: float, preset: str | None = None,
              profile: bool = False, speculate: str | None = None, draft_tokens: int = 4,
              prefill: tuple[int, ...] = ()) -> int:
    graph_arm = model.device.type == "cuda"
    emit("BENCH_BUILD", provenance(model.device, preset), build_s=round(build_s, 2), ranks=model.world,
         dtype=str(model.dtype).removeprefix("torch."), layers=model.cfg.num_hidden_layers,
         gib_per_rank=[round(m / 2**30, 2) for m in model.each("memory_allocated")])
    sp = SamplingParams(temperature=1.0, seed=20260907)
    text = model.tokenizer.encode(PROMPT)
    prefilled = all([_prefill_rows(model, (text * (n // len(text) + 1))[:n], rows, preset) for n in prefill])
    prompt = (text * (prime // len(text) + 1))[:prime]
    cap = prime + steps + 8
    prefix = model.new_state(cap)
    model.prefill(prefix, prompt)
    first = model.draw(prefix, sp)
    eager, graph = model.new_state(cap), model.new_state(cap)
    if graph_arm:
        graph.restore(prefix)
        model.enable_replay(graph, sp)
        model.step(graph, first, sp)  # the capture, outside the timed rows
    walls = {"eager": [], "graph": [], "pipelined": []}
    streams = []
    if graph_arm:  # the pipelined arm's one-row batch graph, captured outside the timed rows
        pipelined = model.new_state(cap)
        pipelined.restore(prefix)
        list(pipelined_tokens(model, pipelined, first, 2, sp, keep_graph=True))
    census0 = [torch.as_tensor(c) for c in model.each("census")]
    order = arms(rows * 2, 1) if graph_arm else ["eager"] * (rows * 2)
    order = [a for arm in order for a in ((arm, "pipelined") if arm == "graph" else (arm,))]
    for row, arm in enumerate(order):
        if arm == "pipelined":
            pipelined.restore(prefix)
            drawn, ns = timed_pipelined(model, pipelined, first, steps, sp)
            walls[arm].append(ns / 1e9)
            streams.append(drawn)
        else:
            state = graph if arm == "graph" else eager
            state.restore(prefix)
            tokens, last, ns = timed_steps(model, state, first, steps, sp)
            walls[arm].append(ns / 1e9)
            streams.append(tokens[1:] + [last])
        emit("BENCH_ROW", row=row, arm=arm, graph_arm=graph_arm, tok_s=round(steps / walls[arm][-1], 3))
    census = [float((torch.as_tensor(c) - c0).sum()) for c, c0 in zip(model.each("census"), census0)]
    # after the timed rows: a profiler session leaves every later launch of the process slower (dsv4.graph_nodes)
    launches = count_launches(model, prefix, eager, graph, first, sp) if graph_arm else {}
    e = steps / statistics.median(walls["eager"])
    g = steps / statistics.median(walls["graph"]) if graph_arm else None
    p = steps / statistics.median(walls["pipelined"]) if graph_arm else None
    same = all(s == streams[0] for s in streams)
    emit("BENCH_SUMMARY", provenance(model.device, preset), prime=prime, steps_per_row=steps,
         rows_per_arm=rows if graph_arm else 2 * rows,
         eager_tok_s=round(e, 3), graph_tok_s=round(g, 3) if graph_arm else None,
         graph_over_eager=round(g / e, 3) if graph_arm else None,
         pipelined_tok_s=round(p, 3) if graph_arm else None,
         pipelined_over_graph=round(p / g, 3) if graph_arm else None,
         same_stream=same, graph_arm=graph_arm,
         reductions_per_token_per_rank=[c / (len(order) * steps) for c in census],
         graph_census=model.graph_census(graph) if graph_arm else {},
         captures=model.captures(graph) if graph_arm else 0, **launches,
         timing_scope="model.step: forward+commit+head+sample+readback, median row; pipelined: the one-row batch "
                      "graph with one step in flight (dsv4.generation.pipelined_tokens, what generate runs on CUDA)")
    if speculate:
        same &= _speculative(model, prompt, first, streams[0], steps, rows, sp, speculate, draft_tokens, graph_arm,
                             e, g, preset)
    if profile:
        _profile(model, prefix, first, sp, g if graph_arm else e, preset, steps)
    if not same:
        print("dsv4 bench: rows sampled different streams" + (" (eager against graph)" if graph_arm else ""),
              file=sys.stderr)
        return 1
    if not prefilled:
        print("dsv4 bench: a prompt's prefills left different logits", file=sys.stderr)
        return 1
    return 0


def _speculative(model, prompt: list[int], first: int, stream: list[int], steps: int, rows: int, sp, name: str,
                 k: int, graph_arm: bool, eager_tok_s: float, graph_tok_s: float | None, preset: str | None) -> bool:
    """BENCH_SPECULATIVE: rows of verify steps (dsv4.speculative, drafter `name`, k drafts; graphs on CUDA) from the
    same prefix (for mtp, prefilled with its window filled: Model.prefill_drafted), each the plain rows' stream (the
    returned bool); tok/s, tokens a step and the drafts accepted, against the plain arms' medians."""
    from . import speculative

    drafter = speculative.DRAFTERS[name]()
    prefix = model.new_state(len(prompt) + steps + 8)
    first_drafts = ()
    if getattr(drafter, "device", False):  # the plain rows' prefix (the same chunks), `first` the token after it
        first_drafts = model.prefill_drafted(prefix, prompt, first, sampling=sp, k=k)
    else:
        model.prefill(prefix, prompt)
    state, walls, tally, same = model.new_state(prefix.capacity), [], speculative.Tally(), True
    for row in range(rows + 1):  # the first row unscored: its compiles and captures
        state.restore(prefix)
        t = speculative.Tally()
        sync(model)
        start = time.perf_counter()
        out = list(speculative.continue_tokens(model, state, first, prompt, steps, sp, drafter, k, tally=t,
                                               graph=graph_arm, drafts=first_drafts))
        sync(model)
        wall = time.perf_counter() - start
        same &= out == stream
        if row:
            walls.append(wall)
            for f in ("steps", "proposed", "accepted", "tokens"):
                setattr(tally, f, getattr(tally, f) + getattr(t, f))
            emit("BENCH_ROW", row=row - 1, arm=f"speculative_{name}", graph_arm=graph_arm,
                 tok_s=round(steps / wall, 3))
    rate = steps / statistics.median(walls)
    emit("BENCH_SPECULATIVE", provenance(model.device, preset), drafter=name, draft_tokens=k, rows=rows,
         steps_per_row=steps, tok_s=round(rate, 3), over_eager=round(rate / eager_tok_s, 3),
         over_graph=round(rate / graph_tok_s, 3) if graph_tok_s else None, verify_steps=tally.steps,
         tokens_per_step=round(tally.tokens_per_step, 3), drafts_accepted=round(tally.acceptance, 4),
         same_stream=same, graph_arm=graph_arm,
         timing_scope="verify steps from the prefix (first draws the same), median row; a draft is right only as "
                      "often as the drafter predicts the model: random weights almost never")
    return same


def _prefill_rows(model, prompt: list[int], rows: int, preset: str | None) -> bool:
    """BENCH_PREFILL: a prompt's prefill (model.prefill at the model's default chunk for a state of its length plus
    8), one unscored run (its compiles), then `rows` timed runs into a fresh state each: the median wall, tokens a
    second, and the logits every run left (the same bytes, or the row is flagged)."""
    import hashlib

    n, walls, shas = len(prompt), [], set()
    for row in range(rows + 1):
        state = model.new_state(n + 8)
        sync(model)
        start = time.perf_counter()
        logits = model.prefill(state, prompt)
        sync(model)
        wall = time.perf_counter() - start
        shas.add(hashlib.sha256(logits.float().cpu().numpy().tobytes()).hexdigest()[:16])
        state.discard()
        if row:
            walls.append(wall)
    wall = statistics.median(walls)
    emit("BENCH_PREFILL", provenance(model.device, preset), prompt_tokens=n, chunk=model.prefill_chunk(n + 8),
         rows=rows, wall_s=round(wall, 4), walls_s=[round(w, 4) for w in walls], tok_s=round(n / wall, 1),
         same_logits=len(shas) == 1,
         timing_scope="model.prefill of the whole prompt into a fresh state (its chunks, their forwards, the last "
                      "token's logits read back), median row after one unscored")
    return len(shas) == 1


def timed_pipelined(model, state, first: int, steps: int, sampling) -> tuple[list[int], int]:
    """`steps` pipelined steps from `first` (dsv4.generation.pipelined_tokens, the graph kept), timed end to end:
    (the tokens drawn, ns)."""
    sync(model)
    start = time.perf_counter_ns()
    drawn = list(pipelined_tokens(model, state, first, steps, sampling, keep_graph=True))
    sync(model)
    return drawn, time.perf_counter_ns() - start


def count_launches(model, prefix, eager, graph, first: int, sp) -> dict:
    """CUDA kernels and copies of one model.step per arm, on rank 0 (the graph's second replay)."""
    counts = {}
    for arm, state in (("eager_cuda_kernels_per_token", eager), ("graph_replay_kernels_per_token", graph)):
        state.restore(prefix)
        model.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            model.step(state, first, sp)
            model.synchronize()
        counts[arm] = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return counts


def _profile(model, prefix, first: int, sp, tok_s: float, preset: str | None, replays: int):
    """BENCH_PROFILE per rank: the phases of one decode step from the prefix (us per token, `replays` timed),
    bytes read per token, and the roofline fraction of the timed arm at the copy bandwidth measured now on
    rank 0's device."""
    from .measure import copy_bandwidth

    scratch = model.new_state(prefix.capacity)
    scratch.restore(prefix)
    per_rank = model.each("profile_steps", scratch, first, sp, 4, replays)
    bandwidth = copy_bandwidth(model.device)
    for rank, rec in enumerate(per_rank):
        total = rec["bytes_per_token"]["total"]
        emit("BENCH_PROFILE", provenance(model.device, preset), rank=rank, **rec, copy_bytes_per_s=bandwidth,
             timed_tok_s=round(tok_s, 3),
             roofline_tok_s=round(bandwidth / total, 1) if bandwidth == bandwidth else None,
             roofline_fraction=round(tok_s * total / bandwidth, 4) if bandwidth == bandwidth else None,
             scope=PROFILE_SCOPE[model.device.type == "cuda"])


# What BENCH_PROFILE measured, on CPU (False) and on CUDA (True).
PROFILE_SCOPE = {
    True: "phases: a timed CUDA graph of model.step's device work (the production graph's step, plus an event node at "
          "each phase's enter and exit), replayed from the prefix's state; the time between consecutive events goes to "
          "the innermost phase open (other: none), so the phases sum to instrumented_us_per_token; plain_us_per_token: "
          "the same step's graph without the events, replayed beside it; overhead = instrumented - plain. "
          "compressor: the compressed layers' pool and windows; indexer (inside compressor, counted apart): the "
          "indexer's compressor and scores + top-k; the projections feeding both are in attention. collective: "
          "all-reduces and the head's all-gather, including the wait for the slowest rank. "
          "bytes: weights touched + cache rows read, this rank",
    False: "phases: eager model.step on CPU (no graph), host perf_counter at each phase's enter and exit; the "
           "time between consecutive marks goes to the innermost phase open (other: none, including the step's host "
           "work outside the device step), so the phases sum to instrumented_us_per_token; plain_us_per_token: the "
           "same step unmarked; compressor/indexer as on CUDA. bytes: weights touched + cache rows read, this rank",
}
