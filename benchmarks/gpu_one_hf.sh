#!/usr/bin/env bash
# A call on one H200 (<= 9 min): issue 10 target 5's second half, mini's graph against HF transformers' generate on
# the same weights in the same process (benchmarks/hf_generate_bench.py: bf16, 64-token prompt, 64 greedy tokens,
# 3 rows; the last HF figure, 45.7 ms a token, is sessions old), then the dense bf16/fp32 GEMVs of a decode step
# swept at 1 and 16 rows (not since session 7).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_one_hf.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=10
step 300 "$OUT/hf_generate_mini.txt" python benchmarks/hf_generate_bench.py --preset mini --device cuda \
  --prompt-tokens 64 --new-tokens 64 --rows 3
left=$((540 - SECONDS))
[ $left -gt 40 ] && step $left "$OUT/dense_world1.txt" python benchmarks/dense_bench.py --world 1 --rows 1,16
