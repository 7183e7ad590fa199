#!/usr/bin/env bash
# Session 49's first call: session 48's last proofs (offline_bench at main's defaults: generate_many then
# model.sample_tokens in one process; the capture test of replay CONFIG gc_hold; the gate with gc_hold on), then why a
# verify step costs 2.5-5 plain steps (speculative_bench --profile 3 on mini and a Flash rank; see gpu_s49_call1.sh).
# Usage: OUT=dir bash benchmarks/gpu_s49_callA.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
export DEADLINE_S=${DEADLINE_S:-570}
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests:$PWD"
step 80 "$OUT/offline_mini.txt" python benchmarks/offline_bench.py --preset mini --device cuda --prompts 16 \
  --prompt-tokens 128 --max-tokens 32 --rounds 3
step 40 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures \
  tests/test_replay_gpu.py::test_a_dead_graph_collected_during_a_capture_does_not_break_it
DSV4_CAPTURE_GC_HOLD=1 step 80 "$OUT/gate_gchold.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 \
  --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate.txt"
step 120 "$OUT/spec_mini.txt" python benchmarks/speculative_bench.py --preset mini --k 1 --k 3 --steps 32 --rounds 2 \
  --graph --zero-head --profile 3
step 170 "$OUT/spec_flash.txt" python benchmarks/speculative_bench.py --preset flash --proxy-world 2 --k 1 --k 3 \
  --steps 16 --rounds 2 --graph --profile 3
