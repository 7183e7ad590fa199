#!/usr/bin/env bash
# Session 35, call 3 (one H200): main's final CUDA code (the compressor's pools and index keys starting on their
# inputs before their PDL wait, compressor CONFIG early, on by default; the windows' geometry made before q's latent):
# every test file with CUDA cases (5 workers; a fresh machine compiles for most of it).
# Usage: OUT=dir bash benchmarks/gpu_s35_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=25
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
gpu_suite 575 "$OUT/pytest_gpu_suite.txt" -p pytest_failures
