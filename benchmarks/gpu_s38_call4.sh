#!/usr/bin/env bash
# Session 38, call 4 (one H200), main's final CUDA code (kernel 2 of a one-token step at 40 registers by default):
#   1. the GPU suite's model half (the files that build a model or run a whole step; moe_tc's long-chunk and wave
#      cases, now slow on CPU only, among them);
#   2. tests/test_moe_gl.py whole (call 3 ran 41 of its cases before its limit);
#   3. the HTTP server on mini at concurrency 1, 4, 16 (issue 12's figures at this tree).
# Usage: OUT=dir bash benchmarks/gpu_s38_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" DURATIONS_FILE="$OUT/durations.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
gpu_suite_of "$GPU_SUITE_MODEL_FILES" 260 "$OUT/pytest_gpu_model.txt" -p pytest_failures
step 200 "$OUT/pytest_moe_gl.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures -n 3 \
  tests/test_moe_gl.py
step 110 "$OUT/serve_mini.txt" python benchmarks/serve_bench.py --preset mini --device cuda --prompt-tokens 64 \
  --max-tokens 64 --warmup 1 --concurrency 1,4,16
