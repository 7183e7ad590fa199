#!/usr/bin/env bash
# Session 37, call 2 (one H200), main's final tree (kernel 1's shared programs: the next K step's tiles first, and
# shared_early on by default):
#   1. the gate on mini (replay correctness, refusal cells, batch identity; its stream against sessions 30-36's
#      6dd64d77: the same bits);
#   2. the GPU suite's model half (gpu_env.sh's GPU_SUITE_MODEL_FILES), every test's seconds recorded.
# Usage: OUT=dir bash benchmarks/gpu_s37_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=25
export FAILURES_FILE="$OUT/failures.txt" DURATIONS_FILE="$OUT/durations.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 120 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 --prime 64 \
  --output 64 --out "$OUT/receipts-gate-mini.txt"
gpu_suite_of "$GPU_SUITE_MODEL_FILES" 400 "$OUT/pytest_gpu_model.txt" -p pytest_failures
