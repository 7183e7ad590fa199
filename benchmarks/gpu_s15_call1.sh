#!/usr/bin/env bash
# Session 15 call 1 (nvidia-h200, one GPU, <= 9 min): the server's concurrency-4 stall with its compiles logged,
# moe_tc's plan specialised per wave size (default) then compiled once (DSV4_MOE_TC_PLAN_FIXED=1); then the FP8
# GEMV's launch configurations at mini's (world 1) and Flash's rank slices (world 2).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s15_call1.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=14
for fixed in 0 1; do
  DSV4_LOG_COMPILES=1 DSV4_MOE_TC_PLAN_FIXED=$fixed step 120 "$OUT/serve_mini_v3_fixed$fixed.txt" \
    python benchmarks/serve_bench.py --preset mini --device cuda --gemv v3 --concurrency 1,4,16,32 \
    --prompt-tokens 64 --max-tokens 64 --warmup 1
done
ARMS='^v2_(default|programs528|k1024|k1024_w8|n32_w8_k1024|n8_k1024_w8|n8_k2048_w8|n8_k1024_w8_p528|n16_k1024_w8_p528)$'
step 110 "$OUT/qgemv_v2_world1.txt" python benchmarks/qgemv_bench.py --world 1 --arms "$ARMS"
step 110 "$OUT/qgemv_v2_world2.txt" python benchmarks/qgemv_bench.py --world 2 --arms "$ARMS"
