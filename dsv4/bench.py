"""`dsv4 bench`: decode speed of the plain (eager) step against full-token graph replay.

One load. Prime a deterministic prompt, then rows of `steps` sampled steps from the same restored
prefix, alternating arms ABBA (eager, graph, graph, eager, ...), each timed end to end
(model.step: forward, commit, head, sampling, readback). Prints JSON records:

  BENCH_BUILD    load wall, device, ranks, dtype, memory per rank
  BENCH_ROW      one row: arm and tok/s
  BENCH_SUMMARY  median tok/s per arm, their ratio, whether both arms sampled the same stream,
                 all-reduces per token per rank (census), the graph's census

On CPU there is no graph arm: its rows run the eager step and are marked so. Exit 1 when the arms
sampled different streams (the replay is then wrong, and its speed means nothing).
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

PROMPT = "The engine that people who run DeepSeek-V4 on their own GPUs reach for first."


def emit(tag: str, **rec):
    print(tag, json.dumps(rec), flush=True)


def run_bench(model, prime: int, steps: int, rows: int, build_s: float, profile: bool = False) -> int:
    from .sampler import SamplingParams

    graph_arm = model.device.type == "cuda"
    emit("BENCH_BUILD", build_s=round(build_s, 2), device=str(model.device), ranks=model.world,
         dtype=str(model.dtype).removeprefix("torch."), layers=model.cfg.num_hidden_layers,
         gib_per_rank=[round(m / 2**30, 2) for m in model.each("memory_allocated")])
    sp = SamplingParams(temperature=1.0, seed=20260907)
    text = model.tokenizer.encode(PROMPT)
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
    walls = {"eager": [], "graph": []}
    streams = {}
    census0 = [torch.as_tensor(c) for c in model.each("census")]
    for row in range(rows * 2):
        arm = ("eager", "graph", "graph", "eager")[row % 4]
        state = graph if arm == "graph" and graph_arm else eager
        state.restore(prefix)
        carry, tokens = first, []
        model.synchronize()
        t = time.perf_counter()
        for _ in range(steps):
            carry = model.step(state, carry, sp)
            tokens.append(carry)
        model.synchronize()
        walls[arm].append(time.perf_counter() - t)
        streams.setdefault(arm, tokens)
        emit("BENCH_ROW", row=row, arm=arm, graph_arm=graph_arm, tok_s=round(steps / walls[arm][-1], 3))
    census = [float((torch.as_tensor(c) - c0).sum()) for c, c0 in zip(model.each("census"), census0)]
    e, g = (steps / statistics.median(walls[a]) for a in ("eager", "graph"))
    same = streams["eager"] == streams["graph"]
    emit("BENCH_SUMMARY", prime=prime, steps_per_row=steps, rows_per_arm=rows, eager_tok_s=round(e, 3),
         graph_tok_s=round(g, 3) if graph_arm else None, graph_over_eager=round(g / e, 3) if graph_arm else None,
         same_stream=same, graph_arm=graph_arm,
         reductions_per_token_per_rank=[c / (2 * rows * steps) for c in census],
         graph_census=model.graph_census(graph) if graph_arm else {},
         timing_scope="model.step: forward+commit+head+sample+readback, median row")
    if profile:
        _profile(model, prefix, first, sp, steps / statistics.median(walls["graph" if graph_arm else "eager"]))
    if not same:
        print("dsv4 bench: eager and graph sampled different streams", file=sys.stderr)
        return 1
    return 0


def _profile(model, prefix, first: int, sp, tok_s: float):
    """BENCH_PROFILE per rank: phases (GPU us and kernels per token, from eager steps: the graph replays the
    same kernels), bytes read per token, and the roofline fraction of the timed arm at the copy bandwidth
    measured now on rank 0's device."""
    from .profile import copy_bandwidth

    scratch = model.new_state(prefix.capacity)
    scratch.restore(prefix)
    per_rank = model.each("profile_steps", scratch, first, sp, 4) if model.world == 1 else \
        model.profile_steps(scratch, first, sp, 4)
    bandwidth = copy_bandwidth(model.device)
    for rank, rec in enumerate(per_rank):
        total = rec["bytes_per_token"]["total"]
        emit("BENCH_PROFILE", rank=rank, **rec, copy_bytes_per_s=bandwidth, timed_tok_s=round(tok_s, 3),
             roofline_tok_s=round(bandwidth / total, 1) if bandwidth == bandwidth else None,
             roofline_fraction=round(tok_s * total / bandwidth, 4) if bandwidth == bandwidth else None,
             scope="phases: kernel time of eager model.step; bytes: weights touched + cache rows read, this rank")
