"""Decode speed, eager against full-token graph replay, in one process and one load.

Prints one JSON record per line. Rows alternate arms (ABBA) and each times `--steps` sampled
steps end to end (model.step: forward, commit, head, sample and the readback), from the same
restored prefix; the figure is the median of each arm's rows. Launches per token: kernel nodes
of the captured graph (the eager step launches the same kernels one by one), and CUDA kernel
launches of one eager step counted by torch.profiler. DSV4_KERNELS=torch|auto picks the torch
reference or the fused Triton kernels (dsv4.kernels); the records carry which.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time

import torch

import dsv4
from dsv4.sampler import sample


def commit_id() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except Exception:
        return "unknown"


def emit(tag, **rec):
    print(tag, json.dumps(rec), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--prime", type=int, default=256)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rows", type=int, default=8)
    args = ap.parse_args()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model = dsv4.load(args.preset, device="cuda", seed=0)
    torch.cuda.synchronize()
    build_s = time.perf_counter() - t0
    emit("BUILD", preset=args.preset, build_s=round(build_s, 2),
         gpu_mem_gib=round(torch.cuda.memory_allocated() / 2**30, 2), device=torch.cuda.get_device_name(),
         commit=commit_id(), torch=torch.__version__, kernels=os.environ.get("DSV4_KERNELS", "auto"))
    sp = dsv4.SamplingParams(temperature=1.0, seed=20260907)
    prompt = torch.randint(2, model.cfg.vocab_size, (args.prime,), generator=torch.Generator().manual_seed(1)).tolist()
    cap = args.prime + args.steps + 8
    prefix = model.new_state(cap)
    model.prefill(prefix, prompt)
    first = int(sample(prefix.logits, sp, args.prime))
    eager, graph = model.new_state(cap), model.new_state(cap)
    graph.restore(prefix)
    model.enable_replay(graph, sp)
    model.step(graph, first, sp)  # capture outside the timed rows

    # Launches of one eager step.
    eager.restore(prefix)
    eager.input.fill_(first)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof, torch.inference_mode():
        model.step_device(eager, sp)
        torch.cuda.synchronize()
    kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        model.step(graph, first, sp)
        torch.cuda.synchronize()
    graph_kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)

    walls = {"eager": [], "graph": []}
    streams = {}
    order = ["eager", "graph", "graph", "eager"]
    for row in range(args.rows):
        arm = order[row % 4]
        state = eager if arm == "eager" else graph
        state.restore(prefix)
        carry, toks = first, []
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(args.steps):
            carry = model.step(state, carry, sp)
            toks.append(carry)
        torch.cuda.synchronize()
        walls[arm].append(time.perf_counter() - t)
        streams.setdefault(arm, toks)
        emit("ROW", row=row, arm=arm, tok_s=round(args.steps / walls[arm][-1], 2))
    census = model.graph_census(graph)
    e, g = (args.steps / statistics.median(walls[a]) for a in ("eager", "graph"))
    emit("DECODE_SUMMARY", preset=args.preset, prime=args.prime, steps_per_row=args.steps,
         rows_per_arm=args.rows // 2, eager_tok_s=round(e, 2), graph_tok_s=round(g, 2),
         graph_over_eager=round(g / e, 3), same_stream=streams["eager"] == streams["graph"],
         eager_cuda_kernels_per_token=kernels, graph_replay_kernels_per_token=graph_kernels, graph_census=census, captures=model.captures(graph),
         timing_scope="model.step: forward+commit+head+sample+readback", device=torch.cuda.get_device_name(),
         kernels=os.environ.get("DSV4_KERNELS", "auto"), commit=commit_id())


if __name__ == "__main__":
    main()
