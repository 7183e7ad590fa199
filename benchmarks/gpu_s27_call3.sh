#!/usr/bin/env bash
# Session 27 call 3 on one H200 (<= 8 min): main's tree with call 1's two same-bits defaults (moe_gl's shared programs
# of 4 tokens, expert_groups' blocks form): the GPU suite whole, then the server on mini at concurrency 1 / 4 / 16 /
# 32 and mini's solo decode (the Triton cache warm from the suite).
# Usage: OUT=dir bash benchmarks/gpu_s27_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
gpu_suite 345 "$OUT/pytest_gpu_suite.txt"
step 75 "$OUT/serve_mini.txt" python benchmarks/serve_bench.py --preset mini --device cuda --concurrency 1,4,16,32 \
  --prompt-tokens 64 --max-tokens 64 --warmup 1
step 55 "$OUT/bench_mini.txt" python -m dsv4.cli bench --preset mini --device cuda --prime 64 --steps 64 --rows 3
