#!/usr/bin/env bash
# The next call on one H200 (<= 9.5 min), main's tree: DSV4_PREFILL_GEMV=v3 (off by default since session 20, whose
# call 6 ran its tests: a 64-token prefill 34.5 -> 24.0 ms on mini) through what has not run with it on, before it
# may be the default:
#   1. the gate on mini with it on;
#   2. the server on mini (--gemv v2, the default process, where prefill takes v2 today) off then on: TTFT and
#      aggregate at concurrency 1 and 16 (64-token prompts, 64 tokens out);
#   3. mini's bench with it on (decode must not move: it changes only prefill chunks).
# Then the GPU suite (benchmarks/gpu_suite_one.sh) with DSV4_PREFILL_GEMV=v3 exported, in the call after.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_one_next.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=14
step 150 "$OUT/gate_mini_prefill_v3.txt" env DSV4_PREFILL_GEMV=v3 python -m dsv4.cli gate --preset mini \
  --device cuda --ranks 1 --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini-prefill-v3.txt"
step 120 "$OUT/serve_mini_v2.txt" python benchmarks/serve_bench.py --preset mini --device cuda --gemv v2 \
  --concurrency 1,16 --prompt-tokens 64 --max-tokens 64 --warmup 1
step 120 "$OUT/serve_mini_v2_prefill_v3.txt" env DSV4_PREFILL_GEMV=v3 python benchmarks/serve_bench.py \
  --preset mini --device cuda --gemv v2 --concurrency 1,16 --prompt-tokens 64 --max-tokens 64 --warmup 1
left=$((550 - SECONDS))
[ $left -gt 60 ] && step $left "$OUT/bench_mini_prefill_v3.txt" env DSV4_PREFILL_GEMV=v3 python -m dsv4.cli bench \
  --preset mini --device cuda --ranks 1 --prime 64 --steps 64 --rows 3
