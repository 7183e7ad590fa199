#!/usr/bin/env bash
# Every test file with CUDA cases, on one H200, in 5 xdist workers (one file a worker: pytest-xdist carried in .whl;
# 5 keeps the files that build mini, ~22 GB each, within the GPU's memory), <= 9 min. Several of these files last ran
# on the device sessions ago (the GPU rule checks a change's own tests; a stale test, like session 17's
# test_moe_options_gpu, is found here). The CPU-only files are CI's.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_suite_one.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
gpu_suite ${SUITE_LIMIT:-520} "$OUT/pytest_gpu_suite.txt"
