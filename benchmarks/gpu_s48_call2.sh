#!/usr/bin/env bash
# Session 48's second call (sent as the first returns, on the warm machine): speculative decoding's costs and yields
# (benchmarks/speculative_bench.py on mini with the head zeroed, and on a Flash rank), the gate's speculative check,
# then the gate and the MTP arms under the Gumbel-max draw (DSV4_SAMPLER=gumbel: its own stream, eager == graph).
# Usage: OUT=dir bash benchmarks/gpu_s48_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
export DEADLINE_S=${DEADLINE_S:-560}
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests:$PWD"
DSV4_SPECULATIVE=1 step 100 "$OUT/spec_mini.txt" python benchmarks/speculative_bench.py --preset mini --k 1 --k 3 \
  --steps 32 --rounds 2 --mtp --graph --zero-head --fused-undo
step 60 "$OUT/gate_speculative.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --prime 32 \
  --output 32 --speculative 3 --out "$OUT/receipts-gate-speculative.txt"
DSV4_SAMPLER=gumbel step 130 "$OUT/gate_gumbel.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 \
  --batch 4 --prime 64 --output 64 --speculative 3 --out "$OUT/receipts-gate-gumbel.txt"
DSV4_SAMPLER=gumbel DSV4_SPECULATIVE=1 step 100 "$OUT/spec_gumbel.txt" python benchmarks/speculative_bench.py \
  --preset mini --k 1 --k 3 --steps 32 --rounds 2 --mtp --graph --zero-head
DSV4_SPECULATIVE=1 step 150 "$OUT/spec_flash.txt" python benchmarks/speculative_bench.py --preset flash \
  --proxy-world 2 --k 1 --steps 16 --rounds 2 --mtp --graph --fused-undo
