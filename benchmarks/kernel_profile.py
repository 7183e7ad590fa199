"""Where one decode step's GPU time goes: the CUDA kernels of one eager step, by name.

One GPU, one load. Prime `--prime` tokens, then profile `--steps` eager sampled steps with
torch.profiler; print the kernels grouped by name with their count per step and their share of
the step's summed kernel time (KERNEL records, largest first), and one PROFILE_SUMMARY. Eager
launches the same kernels the graph replays, so this is also the replayed graph's kernel mix.
"""

from __future__ import annotations

import argparse
import collections

import torch

import dsv4
from dsv4.receipts import emit, provenance
from dsv4.sampler import sample


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--prime", type=int, default=256)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    model = dsv4.load(args.preset, device="cuda", seed=0)
    sp = dsv4.SamplingParams(temperature=1.0, seed=20260907)
    prompt = torch.randint(2, model.cfg.vocab_size, (args.prime,), generator=torch.Generator().manual_seed(1)).tolist()
    state = model.new_state(args.prime + args.steps + 8)
    model.prefill(state, prompt)
    carry = int(sample(state.logits, sp, args.prime))
    carry = model.step(state, carry, sp)  # warm: every kernel compiled and cached
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            carry = model.step(state, carry, sp)
        torch.cuda.synchronize()
    time_us, count = collections.Counter(), collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            time_us[e.name] += e.device_time
            count[e.name] += 1
    total = sum(time_us.values())
    for name, t in time_us.most_common(args.top):
        emit("KERNEL", name=name[:160], per_step=count[name] / args.steps, us_per_step=round(t / args.steps, 1),
             share=round(t / total, 4))
    emit("PROFILE_SUMMARY", provenance(model.device, args.preset), prime=args.prime, steps=args.steps,
         kernels_per_step=sum(count.values()) / args.steps, kernel_us_per_step=round(total / args.steps, 1),
         distinct_kernels=len(time_us), scope="summed CUDA kernel time of eager model.step")


if __name__ == "__main__":
    main()
