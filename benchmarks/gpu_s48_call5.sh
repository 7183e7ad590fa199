#!/usr/bin/env bash
# Session 48's fifth call. Call 4 found (1) a one-row batch graph's capture invalidated after the scheduler had run
# in the same process (offline_bench: "operation not permitted when stream is capturing (function reset)": an old
# graph destroyed by the cycle collector inside the capture; torch.cuda.graph no longer collects first), fixed by
# replay.capturing at every capture site; (2) replays of a verify graph captured with the fused Undo faulting (an
# illegal address), so commit.Undo no longer uses it inside a capture. This runs the capture test, the speculative
# and undo CUDA tests, offline_bench (the reproduction), the gate at main's defaults (every capture now through
# replay.capturing), and speculative_bench on mini with a kernel profile of eager verify steps against plain ones.
# Usage: OUT=dir bash benchmarks/gpu_s48_call5.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
export DEADLINE_S=${DEADLINE_S:-330}
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests:$PWD"
step 100 "$OUT/gate.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 --prime 64 \
  --output 64 --out "$OUT/receipts-gate.txt"
step 140 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -n 3 --dist loadfile -rfE -p pytest_failures \
  tests/test_speculative_gpu.py tests/test_undo.py tests/test_replay_gpu.py::test_a_dead_graph_collected_during_a_capture_does_not_break_it
step 80 "$OUT/offline_mini.txt" python benchmarks/offline_bench.py --preset mini --device cuda --prompts 32 \
  --prompt-tokens 128 --max-tokens 64 --rounds 3
DSV4_SPECULATIVE=1 step 100 "$OUT/spec_mini.txt" python benchmarks/speculative_bench.py --preset mini --k 1 --k 3 \
  --steps 32 --rounds 2 --graph --zero-head --profile 3
