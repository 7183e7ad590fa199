#!/usr/bin/env bash
# Session 21, call 2 (one H200, <= 9.5 min): long prefill chunks on the tensor-core tiles (moe_tc CONFIG long, on by
# default in this tree; DSV4_MOE_TC_LONG=0 the dense path as before) and DSV4_PREFILL_GEMV=v3 by default:
#   1. mini's prefill at 64..4,096 tokens, the default chunk, beside HF transformers at 512 and 4,096 (on);
#   2. the same sizes past a short chunk with DSV4_MOE_TC_LONG=0 (off: the A/B in one call);
#   3. the tiles' configurations past 512 tokens (block_n 128 with 32 / 64 rows, 128 rows);
#   4. the gate on mini (default settings).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s21_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 130 "$OUT/prefill_mini_long_on.txt" python benchmarks/prefill_bench.py mini \
  --sizes 64 128 256 512 1024 2048 4096 --runs 3 --eager-steps 0 --graph-steps 0 --hf-sizes 512 4096
step 75 "$OUT/prefill_mini_long_off.txt" env DSV4_MOE_TC_LONG=0 python benchmarks/prefill_bench.py mini \
  --sizes 256 512 1024 2048 4096 --runs 3 --eager-steps 0 --graph-steps 0 --no-hf
step 45 "$OUT/prefill_moe_tiles.txt" python benchmarks/prefill_moe_bench.py --n-local 256 \
  --tokens 512,1024,2048,4096 --arms "dense|tc_bm32$|tc_bm64$|tc_bm32_n128|tc_bm64_n128|tc_bm128|tc_bm64_s4"
step 150 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 --prime 64 \
  --output 64 --out "$OUT/receipts-gate-mini.txt"
step 60 "$OUT/prefill_kernels_mini_512.txt" python benchmarks/eager_host_profile.py --preset mini --prefill 512 \
  --steps 2 --top 20
