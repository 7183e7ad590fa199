"""Where the eager step's host time goes: cProfile over eager model.step calls (mini on one GPU by default).

The eager arm is host-bound (issue 10, target 4: flash eager >= 12 tok/s). This prints the wall per step, the
CUDA launches per step (torch.profiler) and the functions with the most own time (cProfile), so the next cut
is chosen from a measurement. With --prefill N, the same for a prompt of N tokens prefilled into a fresh state
(a server's time to first token is this prefill): PREFILL_HOST with the wall (median of 5), the CUDA kernels' own
time summed (busy_ms: the rest of the wall is the host's), PREFILL_KERNEL per kernel name (calls, us, share of
busy; the --top largest) and cProfile's tables.
Usage: python benchmarks/eager_host_profile.py [--preset mini] [--steps 32] [--ranks N] [--prefill 64]
With --ranks N > 1 the ranks are spawned (dsv4.api.load) and this process is rank 0: cProfile sees rank 0's own
forward and its dispatch to the other ranks, and the wall includes waiting for them in each collective.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time

import torch

from dsv4.api import load
from dsv4.receipts import emit, provenance
from dsv4.sampler import SamplingParams
try:
    from benchmarks.rank_proxy import build_proxy, label
except ImportError:  # run as a script without the repository's root on the path
    from rank_proxy import build_proxy, label


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--top", type=int, default=45)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--prefill", type=int, default=0, help="also profile a prefill of this many prompt tokens")
    ap.add_argument("--proxy-world", type=int, default=0,
                    help="rank 0 of this many alone on one device (benchmarks/rank_proxy.py), instead of --ranks")
    args = ap.parse_args()
    device = torch.device(args.device)
    if args.proxy_world and args.ranks != 1:
        ap.error("--proxy-world takes one rank")
    model = build_proxy(args.preset, args.proxy_world, 0, device) if args.proxy_world else \
        load(args.preset, device=device, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32,
             ranks=args.ranks)
    try:
        profile(model, device, args)
        if args.prefill:
            profile_prefill(model, device, args)
    finally:
        close = getattr(model, "close", None)
        if close:
            close()


def profile(model, device, args) -> None:
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
    emit("EAGER_HOST", provenance(device, label(args.preset, args.proxy_world)), ranks=args.ranks, wall_ms_per_step=round(wall * 1e3, 2),
         tok_s=round(1 / wall, 1), cuda_events_per_step=launches, steps=args.steps)
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats(key).print_stats(args.top)
        sys.stdout.write(f"== by {key} ({args.steps} steps)\n{s.getvalue()}\n")  # cProfile's own table


def profile_prefill(model, device, args) -> None:
    ids = [1 + i % 1000 for i in range(args.prefill)]
    capacity = args.prefill + 8

    def once():
        state = model.new_state(capacity)
        model.prefill(state, ids)
        sync(device)
        return state

    once()  # every prefill kernel compiled
    walls = []
    for _ in range(5):
        t0 = time.perf_counter()
        once()
        walls.append(time.perf_counter() - t0)
    walls.sort()
    busy = launches = None
    if device.type == "cuda":
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            once()
        events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        launches = len(events)
        busy = round(sum(e.time_range.elapsed_us() for e in events) / 1e3, 3)
        by_name: dict = {}
        for e in events:
            calls, us = by_name.get(e.name, (0, 0.0))
            by_name[e.name] = (calls + 1, us + e.time_range.elapsed_us())
        for name, (calls, us) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:args.top]:
            emit("PREFILL_KERNEL", name=name[:100], calls=calls, us=round(us, 1), share=round(us / 1e3 / busy, 4))
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(3):
        once()
    pr.disable()
    emit("PREFILL_HOST", provenance(device, label(args.preset, args.proxy_world)), ranks=args.ranks, prompt_tokens=args.prefill,
         wall_ms=round(walls[2] * 1e3, 2), busy_ms=busy, cuda_events=launches)
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats(key).print_stats(args.top)
        sys.stdout.write(f"== prefill by {key} (3 prefills)\n{s.getvalue()}\n")


if __name__ == "__main__":
    main()
