#!/usr/bin/env bash
# Session 16 call 4 (nvidia-h200, one GPU): main's final tree. test_moe_gl (the tensor-core programs' shape check
# fixed: kernel 2 keeps the CUDA cores when kernel 1 takes the tensor cores); the gate on mini (--batch 4, 64/64)
# under the defaults (a one-token step's shared programs of 1 token).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s16_call4.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
step 90 "$OUT/pytest_moe_gl.txt" python -m pytest -q -p no:cacheprovider tests/test_moe_gl.py
step 200 "$OUT/gate_mini_batch4.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 \
  --prime 64 --output 64 --out "$OUT/receipts_gate_mini_64.txt"
