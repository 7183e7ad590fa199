#!/usr/bin/env bash
# Session 36, call 1 (one H200):
#   1. decode_ab_bench on mini: the defaults against qgemv v2's 64-row, 512-input, split-K tiles for mini's wo_a too
#      (v2_wide_max_n 8192: its 8 groups x 1,024 rows; other bits) and against v2's split target doubled (v2_programs
#      528: the small FP8 GEMVs split further; other bits), graph and pipelined, ABBA;
#   2. the GPU suite's kernel half (gpu_env.sh's GPU_SUITE_KERNEL_FILES), every test's seconds recorded.
# Usage: OUT=dir bash benchmarks/gpu_s36_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=25
export FAILURES_FILE="$OUT/failures.txt" DURATIONS_FILE="$OUT/durations.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 170 "$OUT/decode_ab.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm wide=qgemv.v2_wide_max_n=8192 --arm prog528=qgemv.v2_programs=528
gpu_suite_of "$GPU_SUITE_KERNEL_FILES" 380 "$OUT/pytest_gpu_kernels.txt" -p pytest_failures
