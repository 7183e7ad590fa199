#!/usr/bin/env bash
# Session 43, call 8 (one H200, the session's last 254 device seconds): moe CONFIG shared_lane (off by default, never
# GPU-run): decode_ab with it at a Flash rank's shapes and on mini, then its CUDA test (eager == graph, the lane taken).
# Usage: OUT=dir bash benchmarks/gpu_s43_call8.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 75 "$OUT/decode_ab_flash.txt" python benchmarks/decode_ab_bench.py --preset flash --proxy-world 2 --steps 64 \
  --rounds 4 --arm lane=moe.shared_lane=1
step 45 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures tests/test_lanes.py \
  -k shared_expert
step 40 "$OUT/decode_ab_mini.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm lane=moe.shared_lane=1
