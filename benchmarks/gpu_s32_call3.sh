#!/usr/bin/env bash
# Session 32, call 3 (one H200, ~7 min), branch s32-rtrevert at 844bc2e (call 2's tree + the test helper mended),
# wheels with opentelemetry-api (fastapi 0.165's need):
#   1. what call 2 failed: tests/test_qgemv.py whole (v2's rows test on the mended helper, v3's cases) and
#      tests/test_cli.py whole (the chat and serve subprocesses, the wheels complete);
#   2. the server on mini with its defaults at concurrency 1 / 4 / 16 / 32 (a throwaway concurrency-1 server first:
#      a fresh machine's first server compiles for 70-130 s).
# Usage: OUT=dir bash benchmarks/gpu_s32_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=25
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 200 "$OUT/pytest_qgemv_cli.txt" python -m pytest -q -p no:cacheprovider -n 3 --dist loadfile --tb=short -rfE \
  -p pytest_failures tests/test_qgemv.py tests/test_cli.py
SERVE="python benchmarks/serve_bench.py --preset mini --device cuda --prompt-tokens 64 --max-tokens 64 --warmup 1"
step 140 "$OUT/serve_warm.txt" $SERVE --concurrency 1
step 90 "$OUT/serve_mini.txt" $SERVE --concurrency 1,4,16,32
