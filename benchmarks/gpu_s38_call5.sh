#!/usr/bin/env bash
# Session 38, call 5 (one H200; the session's last ~390 device seconds): kernel 2's one-token register cap on its
# tensor-core programs only (the CUDA-core programs, DSV4_MOE_MMA=0, uncapped again: 92 registers, 152 bytes of stack
# at 40); the default path's sm_90 SASS is byte-equal to call 4's (sass_census --dump before and after).
#   1. tests/test_moe_gl.py's gluon_experts (CUDA-core and tensor-core programs, bf16 and fp16) and register-cap cases;
#   2. the gate on mini (the stream 6dd64d77 expected).
# Usage: OUT=dir bash benchmarks/gpu_s38_call5.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=20
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 120 "$OUT/pytest_gl.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures -n 3 tests/test_moe_gl.py \
  -k "gluon_experts or register_cap"
step 110 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 --prime 64 \
  --output 64 --out "$OUT/receipts-gate-mini.txt"
