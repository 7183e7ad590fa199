#!/usr/bin/env bash
# Session 40, call 3: the replay census read from the captured graph (dsv4.graph_nodes; no profiler session in a
# serving process: call 2 showed one leaves every later graph launch slower), with call 2's defaults (lane_xproj, the
# wo tiles):
#   1. tests/test_graph_nodes.py (the census against the profiler's activities of a replay);
#   2. the GPU suite's model half (test_replay_gpu asserts the census' nodes), 5 workers;
#   3. the gate on mini under the defaults;
#   4. benchmarks/graph_launch_bench.py --mini: mini's graph launch before and after a profiler session, in one
#      process.
# Usage: OUT=dir bash benchmarks/gpu_s40_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 60 "$OUT/pytest_graph_nodes.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures \
  tests/test_graph_nodes.py
step 100 "$OUT/graph_launch.txt" python benchmarks/graph_launch_bench.py --mini
step 120 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda \
  --ranks 1 --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini-census.txt"
DURATIONS_FILE="$OUT/durations_gpu_model.txt" gpu_suite_of "$GPU_SUITE_MODEL_FILES tests/test_graph_nodes.py" 290 \
  "$OUT/pytest_gpu_model.txt" -p pytest_failures
