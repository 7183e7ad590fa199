"""Where the eager step's host time goes: cProfile over eager model.step calls on one GPU (mini by default).

The eager arm is host-bound (issue 10, target 4: flash eager >= 12 tok/s). This prints the wall per step, the
CUDA launches per step (torch.profiler) and the functions with the most own time (cProfile), so the next cut
is chosen from a measurement. Usage: python benchmarks/eager_host_profile.py [--preset mini] [--steps 32]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time

import torch

from dsv4.engine import build
from dsv4.receipts import emit, provenance
from dsv4.sampler import SamplingParams


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--top", type=int, default=45)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    device = torch.device(args.device)
    model = build(args.preset, device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    sp = SamplingParams(temperature=1.0, seed=1)
    state = model.new_state(64 + 3 * args.steps + 8)
    model.prefill(state, list(range(1, 65)))
    tok = model.draw(state, sp)
    for _ in range(4):  # warm: every kernel compiled
        tok = model.step(state, tok, sp)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        tok = model.step(state, tok, sp)
    sync(device)
    wall = (time.perf_counter() - t0) / args.steps
    launches = None
    if device.type == "cuda":
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            tok = model.step(state, tok, sp)
            sync(device)
        launches = sum(e.count for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(args.steps):
        tok = model.step(state, tok, sp)
    sync(device)
    pr.disable()
    emit("EAGER_HOST", provenance(device, args.preset), wall_ms_per_step=round(wall * 1e3, 2),
         tok_s=round(1 / wall, 1), cuda_events_per_step=launches, steps=args.steps)
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats(key).print_stats(args.top)
        sys.stdout.write(f"== by {key} ({args.steps} steps)\n{s.getvalue()}\n")  # cProfile's own table


if __name__ == "__main__":
    main()
