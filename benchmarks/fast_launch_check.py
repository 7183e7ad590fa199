"""FastLaunch (DSV4_FAST_LAUNCH) on a GPU, in one process: the same eager steps with Triton's own launches and
through FastLaunch, bytes and time.

Two states prefill one prompt and step with one sampling seed; rounds alternate which arm steps first. Every step's
token, and each state's digests and logits at the end, must be equal (FastLaunch runs the kernels Triton's run
would, on the same arguments). The wall per step of each arm is the median over rounds.
Usage: python benchmarks/fast_launch_check.py [--preset mini] [--steps 32] [--rounds 3]
Prints FAST_LAUNCH_CHECK {..., equal, off_ms_per_step, on_ms_per_step, fast_entries}.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from dsv4 import kernels
from dsv4.engine import build
from dsv4.receipts import emit, provenance
from dsv4.sampler import SamplingParams


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def steps(model, state, tok, sp, n: int, fast: bool):
    """n eager steps with FastLaunch on or off -> (tokens, seconds)."""
    kernels.FAST_LAUNCH = fast
    sync(model.device)
    t0 = time.perf_counter()
    tokens = []
    for _ in range(n):
        tok = model.step(state, tok, sp)
        tokens.append(tok)
    sync(model.device)
    return tokens, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cuda")  # cpu: a smoke run of this script (no compiled kernels there)
    args = ap.parse_args()
    device = torch.device(args.device)
    model = build(args.preset, device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    sp = SamplingParams(temperature=1.0, seed=1)
    states = {fast: model.new_state(64 + (args.rounds + 1) * args.steps + 8) for fast in (False, True)}
    toks = {}
    for fast, state in states.items():
        kernels.FAST_LAUNCH = fast
        model.prefill(state, list(range(1, 65)))
        toks[fast] = model.draw(state, sp)
    equal, wall = toks[False] == toks[True], {False: [], True: []}
    for r in range(args.rounds + 1):  # round 0 warms both arms (every kernel compiled, every key seen)
        order = (False, True) if r % 2 else (True, False)
        out = {}
        for fast in order:
            out[fast], seconds = steps(model, states[fast], toks[fast], sp, args.steps, fast)
            toks[fast] = out[fast][-1]
            if r:
                wall[fast].append(seconds / args.steps)
        equal = equal and out[False] == out[True]
    logits_equal = torch.equal(states[False].logits, states[True].logits)
    digests_equal = model.digests(states[False]) == model.digests(states[True])
    entries = sum(len(f.kernels) for f in kernels._fast.values() if isinstance(f, kernels.FastLaunch))
    off, on = (statistics.median(wall[f]) * 1e3 for f in (False, True))
    emit("FAST_LAUNCH_CHECK", provenance(device, args.preset), steps=args.steps, rounds=args.rounds,
         equal=bool(equal and logits_equal and digests_equal), tokens_equal=bool(equal), logits_equal=logits_equal,
         digests_equal=digests_equal, off_ms_per_step=round(off, 2), on_ms_per_step=round(on, 2),
         speedup=round(off / on, 3), fast_kernels=len(kernels._fast), fast_entries=entries)


if __name__ == "__main__":
    main()
