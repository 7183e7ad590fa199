#!/usr/bin/env bash
# Session 21, call 1 (one H200, <= 9.5 min), main's tree:
#   1. prefill's routed experts for a long chunk (129-4,096 tokens: today the dense path, every local expert
#      dequantised): the tensor-core tiles (moe_tc, a short chunk's path) and their configurations against it,
#      mini's 256 experts on one GPU and a Flash rank's 128;
#   2. gpu_one_next.sh's DSV4_PREFILL_GEMV=v3 checks: the gate with it on, the server (v2 process) off / on.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s21_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=60
step 120 "$OUT/prefill_moe_mini.txt" python benchmarks/prefill_moe_bench.py --n-local 256 \
  --tokens 128,256,512,1024,2048,4096 --arms "dense|^tc"
step 45 "$OUT/prefill_moe_flash_rank.txt" python benchmarks/prefill_moe_bench.py --n-local 128 \
  --tokens 256,1024,4096 --arms "dense|^tc$|tc_bm64$"
step 150 "$OUT/gate_mini_prefill_v3.txt" env DSV4_PREFILL_GEMV=v3 python -m dsv4.cli gate --preset mini \
  --device cuda --ranks 1 --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini-prefill-v3.txt"
step 110 "$OUT/serve_mini_v2.txt" python benchmarks/serve_bench.py --preset mini --device cuda --gemv v2 \
  --concurrency 1,16 --prompt-tokens 64 --max-tokens 64 --warmup 1
step 110 "$OUT/serve_mini_v2_prefill_v3.txt" env DSV4_PREFILL_GEMV=v3 python benchmarks/serve_bench.py \
  --preset mini --device cuda --gemv v2 --concurrency 1,16 --prompt-tokens 64 --max-tokens 64 --warmup 1
