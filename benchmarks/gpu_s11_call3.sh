#!/usr/bin/env bash
# Session 11 call 3 (nvidia-h200, one GPU, <= 8 min), branch s11 = main + pdlx, with main's tree as _base (carried
# untracked): main's two-launch sampler through the gate and the server, and pdlx's default path against main's.
#   1. the gate on mini at the seed's sizes (256/256), --batch 4, main's tree, defaults (the new sampler in every
#      replayed step, the batch identity, refusals);
#   2. serve_bench on mini, main's tree: concurrency 1, 4, 16 (the batched steps' sampler no longer sorts);
#   3. mini decode, main vs s11 with DSV4_PDL=0, ABAB (call 2's s11 arm was 5.7 % slower with a noisy host).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s11_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
step 170 "$OUT/gate_mini_256.txt" env -C _base PYTHONPATH="$PWD/_base" python -m dsv4.cli gate --preset mini \
  --device cuda --ranks 1 --batch 4 --out "$OUT/receipts_gate_mini_256.txt"
step 130 "$OUT/serve_mini.txt" env -C _base PYTHONPATH="$PWD/_base:$PYTHONPATH" python benchmarks/serve_bench.py \
  --preset mini --device cuda --concurrency 1,4,16 --prompt-tokens 64 --max-tokens 64
mini() {  # mini NAME DIR
  step 45 "$OUT/bench_mini_$1.txt" env -C "$2" PYTHONPATH="$PWD/$2" DSV4_PDL=0 python -m dsv4.cli bench --preset mini \
    --device cuda --prime 64 --steps 128 --rows 3
}
mini a_base _base
mini b_s11 .
mini c_base _base
mini d_s11 .
