#!/usr/bin/env bash
# Session 49 call D: the fused Undo's tables now in room reserved before the capture (call C's compute-sanitizer: the
# graph overwrote a table of its own pool); gc_hold now on by default (call C: offline_bench's capture fault again).
# Proofs: test_undo, the verify graph cases (torch and fused Undo), the gc_hold capture case; offline_bench at the
# defaults; then the verify cost with the fused Undo in the graphs (speculative_bench --fused-undo) on mini and a
# Flash rank; the gate's speculative verify steps with it, if time is left.
# Usage: OUT=dir bash benchmarks/gpu_s49_callD.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=14
export DEADLINE_S=${DEADLINE_S:-380}
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests:$PWD"
step 110 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures tests/test_undo.py \
  tests/test_speculative_gpu.py::test_verify_graph_is_the_eager_verify \
  tests/test_replay_gpu.py::test_a_dead_graph_collected_during_a_capture_does_not_break_it
step 70 "$OUT/offline_mini.txt" python benchmarks/offline_bench.py --preset mini --device cuda --prompts 16 \
  --prompt-tokens 128 --max-tokens 32 --rounds 3
export DSV4_UNDO_FUSED_CAPTURE=1
step 70 "$OUT/spec_mini_fused.txt" python benchmarks/speculative_bench.py --preset mini --k 1 --k 3 --steps 32 \
  --rounds 2 --graph --zero-head --fused-undo
step 120 "$OUT/spec_flash_fused.txt" python benchmarks/speculative_bench.py --preset flash --proxy-world 2 --k 3 \
  --steps 16 --rounds 2 --graph --fused-undo
DSV4_UNDO_FUSED=1 step 60 "$OUT/gate_spec_fused.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 \
  --batch 4 --prime 64 --output 64 --speculative 3 --out "$OUT/receipts-gate-spec-fused.txt"
