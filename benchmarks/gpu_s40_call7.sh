#!/usr/bin/env bash
# Session 40, call 7 (call 6's tree with qgemv's v2_xq_tiles on by default): the gate on mini under the defaults (a
# new stream expected: the stacked wq_a + wkv's bits), test_qgemv's tile cases and the replay test.
# Usage: OUT=dir bash benchmarks/gpu_s40_call7.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 100 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda \
  --ranks 1 --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini-xq.txt"
step 90 "$OUT/pytest_xq.txt" python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile -rfE -p pytest_failures \
  tests/test_qgemv.py tests/test_replay_gpu.py -k "xq_tiles or shape_tiles or replay or eager_step"
