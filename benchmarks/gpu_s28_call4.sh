#!/usr/bin/env bash
# Session 28, call 4 (one H200; main at the session's end: session 27's review mends, the server's GEMVs mma by
# default): the GPU suite whole (~400 s: call 1's was cut at 94 % by 370 s).
# Usage: OUT=dir bash benchmarks/gpu_s28_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
gpu_suite 440 "$OUT/pytest_gpu_suite.txt"
