#!/usr/bin/env bash
# Session 49: the fused Undo inside a verify graph. Session 48's replays faulted; the capture's tables were let go
# after their fill, back to the graph's pool while the graph read them, and VerifyReplay now keeps them.
# test_speculative_gpu's graph cases with CONFIG fused and capture on, test_undo; undo_capture_diag (keep: main;
# drop: session 48's let-go, each arm in its own process; the tables' fill and every baked address looked up in the
# allocator); then speculative_bench with the fused Undo in the graphs (its cost against call A's torch Undo).
# Usage: OUT=dir bash benchmarks/gpu_s49_callB.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=24
export DEADLINE_S=${DEADLINE_S:-570}
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests:$PWD"
step 150 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures tests/test_undo.py \
  "tests/test_speculative_gpu.py::test_verify_graph_is_the_eager_verify"
step 150 "$OUT/diag.txt" python benchmarks/undo_capture_diag.py --preset mini --rows 4
DSV4_UNDO_FUSED=1 DSV4_UNDO_FUSED_CAPTURE=1 step 120 "$OUT/spec_mini_fused.txt" python benchmarks/speculative_bench.py \
  --preset mini --k 1 --k 3 --steps 32 --rounds 2 --graph --zero-head
DSV4_UNDO_FUSED=1 DSV4_UNDO_FUSED_CAPTURE=1 step 150 "$OUT/spec_flash_fused.txt" python benchmarks/speculative_bench.py \
  --preset flash --proxy-world 2 --k 1 --k 3 --steps 16 --rounds 2 --graph
