#!/usr/bin/env bash
# Session 48's last call, cut to the device time left after refused starts: what would turn replay CONFIG gc_hold on
# (DSV4_CAPTURE_GC_HOLD=1: every graph capture with the cycle collector run before it and held off in it): the gate
# with it (96066ac1 / 1fd7a9bb), offline_bench with it (call 4's reproduction: generate_many, then
# model.sample_tokens in the same process), the capture test, the undo CUDA cases.
# Usage: DEADLINE_S=N OUT=dir bash benchmarks/gpu_s48_call5b.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
export DEADLINE_S=${DEADLINE_S:-250}
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests:$PWD"
DSV4_CAPTURE_GC_HOLD=1 step 100 "$OUT/gate.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 --prime 64 \
  --output 64 --out "$OUT/receipts-gate.txt"
step 40 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures tests/test_undo.py \
  tests/test_replay_gpu.py::test_a_dead_graph_collected_during_a_capture_does_not_break_it
DSV4_CAPTURE_GC_HOLD=1 step 70 "$OUT/offline_mini.txt" python benchmarks/offline_bench.py --preset mini --device cuda --prompts 32 \
  --prompt-tokens 128 --max-tokens 64 --rounds 3
