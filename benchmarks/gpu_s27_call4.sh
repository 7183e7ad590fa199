#!/usr/bin/env bash
# Session 27 call 4 on one H200 (<= 5 min): the mma GEMV family against v3, the server's default, in one call:
#   1. qgemv_bench --rows 1,8,16 on a Flash rank's FP8 linears (call 3's run stopped at the scales' range check
#      inside the timing graph; each call now runs eagerly once first): v2 (8 rows a program), v3, mma's tiles;
#   2. the server on mini at concurrency 1 / 4 / 16 / 32 with the mma family, then with v3 (IDENTITY in both).
# Usage: OUT=dir bash benchmarks/gpu_s27_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 75 "$OUT/qgemv_mma_rows.txt" python benchmarks/qgemv_bench.py --world 2 --rows 1,8,16 \
  --arms '^(v2_rows8|v3_default|mma_default|mma_u2|mma_p528)$'
SERVE="python benchmarks/serve_bench.py --preset mini --device cuda --concurrency 1,4,16,32 --prompt-tokens 64 \
  --max-tokens 64 --warmup 1"
step 100 "$OUT/serve_mini_mma.txt" env DSV4_QGEMV=mma DSV4_DENSE_GEMV=v3 $SERVE
step 100 "$OUT/serve_mini_v3.txt" env DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 $SERVE
