"""A Flash rank's eager decode steps and nothing else worth a kernel profiler's filter: benchmarks/rank_proxy.py's
rank (rank 0 of --world, alone on one GPU) prefilled with 64 tokens, then --steps eager steps of one token. A target
for ncu, which then sees the rank's kernels with their real shapes (as benchmarks/moe_one.py is for one layer's experts):

    ncu --clock-control none --kernel-name regex:"_boundary_kernel|_gl_kernel" --launch-skip 860 --launch-count 12 \\
        --section SpeedOfLight python benchmarks/proxy_steps.py --steps 6

A step launches each layer's kernels in the model's order (43 layers: 86 boundaries, 43 of each expert kernel); the
prefill's and the first steps' launches come first (skip them to profile a warm one-token step).
"""

from __future__ import annotations

import argparse

import torch

from dsv4.receipts import emit, provenance
from dsv4.sampler import SamplingParams
try:
    from benchmarks.rank_proxy import build_proxy, label
except ImportError:  # run as a script without the repository's root on the path
    from rank_proxy import build_proxy, label


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="flash")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    device = torch.device("cuda")
    model = build_proxy(args.preset, args.world, 0, device)
    sp = SamplingParams(temperature=1.0, seed=1)
    state = model.new_state(64 + args.steps + 8)
    model.prefill(state, list(range(1, 65)))
    tok = model.draw(state, sp)
    for _ in range(args.steps):
        tok = model.step(state, tok, sp)
    torch.cuda.synchronize()
    emit("PROXY_STEPS", provenance(device, label(args.preset, args.world)), steps=args.steps, last_token=int(tok))


if __name__ == "__main__":
    main()
