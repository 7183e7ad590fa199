#!/usr/bin/env bash
# A call on nvidia-h200-x2 (<= 9 min), main's tree: prefill on Flash over 2 ranks since session 21, never run there:
# moe_tc's tiles for a short chunk (session 13) and a long one (session 21's CONFIG long, each rank skipping the
# other's experts), the FP8 linears' one-pass dequant, DSV4_PREFILL_GEMV=v3; against the long chunks' dense path
# (DSV4_MOE_TC_LONG=0 DSV4_DEQUANT_FP8=0) in the same call. Session 7's figures: 64 tokens 0.124 s, 128 tokens
# 0.159 s, 4,096 tokens 0.605 s (records/prefill-flash-short-f75b094-2xh200.txt).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_x2_prefill.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=20
step 240 "$OUT/prefill_flash_tiles.txt" python benchmarks/prefill_bench.py flash --sizes 64 128 1024 4096 --runs 3 \
  --eager-steps 0 --graph-steps 16
step 200 "$OUT/prefill_flash_dense.txt" env DSV4_MOE_TC_LONG=0 DSV4_DEQUANT_FP8=0 python benchmarks/prefill_bench.py \
  flash --sizes 1024 4096 --runs 3 --eager-steps 0 --graph-steps 0
step 80 "$OUT/pytest_moe_tc_two_ranks.txt" python -m pytest -q -p no:cacheprovider tests/test_moe_tc.py \
  tests/test_prefill_batch.py -k "two_ranks or long_chunk or tensor_core"
