#!/usr/bin/env bash
# Session 45 call 3: hc_boundary CONFIG defer_sinkhorn with the Sinkhorn kept before the wait (_settled; call 2 found
# ptxas had moved it after ACQBULK): the bench's mid boundary, decode_ab on a Flash rank and mini, its CUDA tests and
# the gate on mini with it on.
# Usage: OUT=dir bash benchmarks/gpu_s45_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 70 "$OUT/hc_boundary.txt" python benchmarks/hc_boundary_bench.py --rows 1,4 --arms 'fused_default$|fused_deferred'
step 150 "$OUT/decode_ab_flash.txt" python benchmarks/decode_ab_bench.py --preset flash --proxy-world 2 --steps 64 \
  --rounds 4 --arm defer=hc_boundary.defer_sinkhorn=1
step 70 "$OUT/decode_ab_mini.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm defer=hc_boundary.defer_sinkhorn=1
step 100 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures tests/test_hc_boundary.py
DSV4_BOUNDARY_DEFER=1 step 130 "$OUT/gate.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 \
  --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate.txt"
