#!/usr/bin/env bash
# Session 48's last call, cut to the device time left after four refused starts: offline_bench at main's defaults
# (call 4's reproduction: generate_many, then model.sample_tokens in one process; its cycle now gone at the root:
# generate_many drops its scheduler's unstarted thread (Scheduler.driven_inline) and its emitters' list), then the capture test of replay CONFIG
# gc_hold (off by default).
# Usage: DEADLINE_S=N OUT=dir bash benchmarks/gpu_s48_call5c.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
export DEADLINE_S=${DEADLINE_S:-140}
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests:$PWD"
step 90 "$OUT/offline_mini.txt" python benchmarks/offline_bench.py --preset mini --device cuda --prompts 16 \
  --prompt-tokens 128 --max-tokens 32 --rounds 3
step 40 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures \
  tests/test_replay_gpu.py::test_a_dead_graph_collected_during_a_capture_does_not_break_it
