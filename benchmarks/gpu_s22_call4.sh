#!/usr/bin/env bash
# Session 22 call 4 (one H200, warm after call 3): the GPU suite whole on call 3's tree.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s22_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
gpu_suite 480 "$OUT/pytest_gpu_suite.txt" --durations=10
