#!/usr/bin/env bash
# Session 43, call 6 (one H200): gate_route as it lands (call 5's tree less route's in-order normalisation, which
# failed test_route_kernel's fp32 case by 0.4 ulp and cost reductions; bf16 logits only): its CUDA tests and the
# router's, the gate on mini, decode_ab on and off at a Flash rank's shapes and on mini.
# Usage: OUT=dir bash benchmarks/gpu_s43_call6.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 90 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile -rfE -p pytest_failures \
  tests/test_gate_route.py tests/test_route_kernel.py
step 100 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda \
  --ranks 1 --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini.txt"
step 90 "$OUT/decode_ab_flash.txt" python benchmarks/decode_ab_bench.py --preset flash --proxy-world 2 --steps 64 \
  --rounds 6 --arm off=gate_route.on=0
step 70 "$OUT/decode_ab_mini.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 6 \
  --arm off=gate_route.on=0
