#!/usr/bin/env bash
# Session 34, call 2 (one H200): main's final CUDA code (the compressor's paired one-pass pools and the stacked x linear
# first on by default; settle's 1,024-element blocks; a batched step's start and end in one launch each,
# bookkeeping.batch_ends): every test file with CUDA cases (5 workers), then the gate on mini under the defaults
# (its stream must be sessions 30-33's: every change is the same bits).
# Usage: OUT=dir bash benchmarks/gpu_s34_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=25
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
gpu_suite 480 "$OUT/pytest_gpu_suite.txt" -p pytest_failures
step 100 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 --prime 64 \
  --output 64 --out "$OUT/receipts-gate-mini.txt"
