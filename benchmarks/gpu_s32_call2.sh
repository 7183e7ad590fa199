#!/usr/bin/env bash
# Session 32, call 2 (one H200, ~9 min), branch s32-rtrevert: main (call 1's tree: the _reduce_tile mend and the lean
# prologue, GPU-checked there) + qgemv v3's row tiles removed (call 1 measured them slower; v3's one-tile loop as
# before, its bits held to main's old kernel by tests/v3_main.py): the GPU suite whole (5 workers), failures written
# as they happen.
# Usage: OUT=dir bash benchmarks/gpu_s32_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=25
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
gpu_suite 540 "$OUT/pytest_gpu_suite.txt" -p pytest_failures
