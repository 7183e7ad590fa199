#!/usr/bin/env bash
# Session 14 call 6 (nvidia-h200, one GPU, <= 3 min): the server on mini under main's final defaults (moe_gl on,
# the sampler's int32 kept set), v3, concurrency 1, 4, 16, 32.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s14_call6.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
step 150 "$OUT/serve_mini_v3.txt" python benchmarks/serve_bench.py --preset mini --device cuda --gemv v3 \
  --concurrency 1,4,16,32 --prompt-tokens 64 --max-tokens 64 --warmup 1
