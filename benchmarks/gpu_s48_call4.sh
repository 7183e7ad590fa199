#!/usr/bin/env bash
# Session 48's fourth call: call 1 found the fused Undo's table fill refused outside inference mode (an in-place
# update of tables made in the capture's inference mode) and a failed capture's tables reaching the next; fixed in
# kernels/undo.py and replay.VerifyReplay. Its CUDA tests again (test_undo's CPU cases now only where interpreted),
# then speculative_bench on mini (head zeroed) with the fused Undo arms and each graph's kernel nodes, and a profile of
# eager verify steps against plain steps by kernel name (why a 2-row verify graph cost 2.5 plain steps in call 2),
# then on a Flash rank; last mini's prefill at 1,024 and 4,096 tokens (dsv4 bench --prefill) and offline batches.
# Usage: OUT=dir bash benchmarks/gpu_s48_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
export DEADLINE_S=${DEADLINE_S:-450}
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests:$PWD"
step 130 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -n 3 --dist loadfile -rfE -p pytest_failures \
  tests/test_speculative_gpu.py tests/test_undo.py
DSV4_SPECULATIVE=1 step 120 "$OUT/spec_mini.txt" python benchmarks/speculative_bench.py --preset mini --k 1 --k 3 \
  --steps 32 --rounds 2 --mtp --graph --zero-head --fused-undo --profile 3
DSV4_SPECULATIVE=1 step 130 "$OUT/spec_flash.txt" python benchmarks/speculative_bench.py --preset flash \
  --proxy-world 2 --k 1 --k 3 --steps 16 --rounds 2 --graph --fused-undo
step 70 "$OUT/offline_mini.txt" python benchmarks/offline_bench.py --preset mini --device cuda --prompts 32 \
  --prompt-tokens 128 --max-tokens 64 --rounds 3
