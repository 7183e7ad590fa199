#!/usr/bin/env bash
# Session 31's call 2 (one H200, <= 9 min): call 1's GPU suite (cut at 97 % with 13 failures, their names lost with
# the cut) again on the branch with the launches mend, its failures written as they happen (tests/pytest_failures.py)
# and every test's name (-v).
# Usage: OUT=dir bash benchmarks/gpu_s31_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
touch "$FAILURES_FILE"
gpu_suite 490 "$OUT/pytest_gpu_suite.txt" -v --tb=short -p pytest_failures
