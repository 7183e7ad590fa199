#!/usr/bin/env bash
# Session 39, call 4: the lane on by default, in captured graphs only (dsv4.kernels.lanes.use: call 3's gate measured
# mini's eager decode 90.5 -> 45 tok/s with the lane in eager steps too; call 5 showed that figure to be the fresh
# machine's first minute, not the lane), both lanes' tickets made at once.
#   1. the gate on mini under the defaults (the stream 6dd64d77 and final logits 2c87c0e8 expected; the eager arm's
#      speed back at ~90 tok/s);
#   2. tests/test_lanes.py (the lane in graphs only; the same bits plain, pooled and batched);
#   3. decode_ab_bench on mini: the defaults (lane on) against nolane=layout.lane=0;
#   4. the GPU suite's model half under the defaults.
# Usage: OUT=dir bash benchmarks/gpu_s39_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" DURATIONS_FILE="$OUT/durations.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 115 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 --prime 64 \
  --output 64 --out "$OUT/receipts-gate-mini.txt"
step 80 "$OUT/pytest_lanes.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures tests/test_lanes.py
step 130 "$OUT/decode_ab_nolane.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm nolane=layout.lane=0
gpu_suite_of "$GPU_SUITE_MODEL_FILES" 250 "$OUT/pytest_gpu_model.txt" -p pytest_failures
