#!/usr/bin/env bash
# Session 12 call 4 (nvidia-h200, one GPU, <= 7 min): the server's steady state on mini (serve_bench --warmup 1:
# each level run once untimed first, so the kernels' first compiles for the prefill shapes a level makes stay out
# of its figures; call 3's concurrency-16 levels were dominated by them), v3, pipelined rounds; DSV4_PDL 0 and 1.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s12_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
step 200 "$OUT/serve_mini_v3_warm_pdl0.txt" env DSV4_PDL=0 python benchmarks/serve_bench.py --preset mini \
  --device cuda --gemv v3 --concurrency 1,4,16,32 --prompt-tokens 64 --max-tokens 64 --warmup 1
step 140 "$OUT/serve_mini_v3_warm_pdl1.txt" env DSV4_PDL=1 python benchmarks/serve_bench.py --preset mini \
  --device cuda --gemv v3 --concurrency 1,16 --prompt-tokens 64 --max-tokens 64 --warmup 1
