#!/usr/bin/env bash
# The Gumbel-max draw's first GPU run (session 47; DSV4_SAMPLER=gumbel, opt-in, CPU-proven): device draws against the
# host's (tests/test_gumbel.py's CUDA case: the shared table), the gate on mini with it (eager against graph, every
# byte, the batch and speculative checks: the identities under the new stream), then the MTP arms of
# speculative_bench on mini with the head zeroed under both draws (what the draw costs as torch ops in a step).
# Run after benchmarks/gpu_speculative_call.sh has passed. Usage: OUT=dir bash benchmarks/gpu_gumbel_call.sh (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests:$PWD"
step 90 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures tests/test_gumbel.py
DSV4_SAMPLER=gumbel step 150 "$OUT/gate_gumbel.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 \
  --batch 4 --prime 64 --output 64 --speculative 3 --out "$OUT/receipts-gate-gumbel.txt"
DSV4_SAMPLER=gumbel DSV4_SPECULATIVE=1 step 150 "$OUT/spec_gumbel.txt" python benchmarks/speculative_bench.py \
  --preset mini --k 1 --k 3 --steps 32 --rounds 2 --mtp --graph --zero-head
