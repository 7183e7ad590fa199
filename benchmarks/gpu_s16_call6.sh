#!/usr/bin/env bash
# Session 16 call 6 (nvidia-h200, one GPU, <= 5 min): main's final tree, moe_gl's tensor-core programs on by
# default: the server on mini (v3, concurrency 1 / 4 / 16 / 32) and mini's kernels a token (graph and eager).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s16_call6.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=14
step 150 "$OUT/serve_mini_v3.txt" python benchmarks/serve_bench.py --preset mini --device cuda --gemv v3 \
  --concurrency 1,4,16,32 --prompt-tokens 64 --max-tokens 64 --warmup 1
step 90 "$OUT/kernel_table_mini.txt" python benchmarks/kernel_table.py --preset mini --steps 16
