#!/usr/bin/env bash
# Session 21, call 3 (one H200, <= 9.5 min), main's tree (long chunks on the tensor-core tiles with 128 columns;
# the FP8 dequant kernel for a long chunk's linears; DSV4_PREFILL_GEMV=v3 by default):
#   1. every test file with CUDA cases (gpu_suite_one.sh's list), 5 workers;
#   2. mini's prefill at 256 / 1,024 / 4,096 tokens with the FP8 kernel and without (DSV4_DEQUANT_FP8=0);
#   3. a 512-token prefill kernel by kernel.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s21_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
gpu_suite 300 "$OUT/pytest_gpu_suite.txt"
step 60 "$OUT/prefill_mini_fp8_on.txt" python benchmarks/prefill_bench.py mini --sizes 256 1024 4096 --runs 3 \
  --eager-steps 0 --graph-steps 0 --no-hf
step 55 "$OUT/prefill_mini_fp8_off.txt" env DSV4_DEQUANT_FP8=0 python benchmarks/prefill_bench.py mini \
  --sizes 256 1024 4096 --runs 3 --eager-steps 0 --graph-steps 0 --no-hf
step 50 "$OUT/prefill_kernels_mini_512.txt" python benchmarks/eager_host_profile.py --preset mini --prefill 512 \
  --steps 2 --top 20
