#!/usr/bin/env bash
# Session 23 call 3 (one H200): DSV4_MOE_TC_BF16_DECODE on by default (call 2: the same bits end to end, faster
# experts): the gate on mini, then the GPU suite whole (tests/test_moe_tc.py's bf16 test among them).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s23_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
step 100 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 --prime 64 \
  --output 64 --out "$OUT/receipts-gate-mini.txt"
gpu_suite 430 "$OUT/pytest_gpu_suite.txt" --durations=10
