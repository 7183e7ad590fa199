#!/usr/bin/env bash
# Session 28, call 1 (one H200; branch s28-land = main + s27-review-mends + s27-mma16): the GPU suite whole with
# test_qgemv_mma (the 16-column test in it), a Flash rank's FP8 linears at 1 / 8 / 16 rows with the 16-column arm,
# and the gate on mini (default GEMVs). Usage: OUT=dir bash benchmarks/gpu_s28_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
gpu_suite 370 "$OUT/pytest_gpu_suite.txt"
step 60 "$OUT/qgemv_mma16_rows.txt" python benchmarks/qgemv_bench.py --world 2 --rows 1,8,16 \
  --arms '^(v3_default|mma_default|mma_c16)$'
step 95 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 \
  --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini.txt"
