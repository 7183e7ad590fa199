#!/usr/bin/env bash
# Session 21, call 4 (one H200, <= 9.5 min), main's tree as call 3's: the GPU suite whole (call 3's was cut at its
# 300 s limit at ~93 % with no failure), then the server on mini with 1,024-token prompts (long prefill chunks:
# the tensor-core tiles and the FP8 kernel) at concurrency 1 and 4.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s21_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
gpu_suite 420 "$OUT/pytest_gpu_suite.txt" --durations=15
left=$((560 - SECONDS))
[ $left -gt 60 ] && step $left "$OUT/serve_mini_1024.txt" python benchmarks/serve_bench.py --preset mini \
  --device cuda --concurrency 1,4 --prompt-tokens 1024 --max-tokens 64 --warmup 1
