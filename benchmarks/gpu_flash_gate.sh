#!/usr/bin/env bash
# Issue 10 target 4 (nvidia-h200-x2, one whole call): the gate on flash at the seed's sizes (prime 256, output 256),
# two ranks, under the defaults: replay identity on every rank, the refusal cells, the ABBA timing; exit 0 inside
# the call's 10 minutes is the target. Receipts under $OUT.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_flash_gate.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
step 585 "$OUT/gate_flash_256.txt" python -m dsv4.cli gate --preset flash --device cuda --ranks 2 \
  --out "$OUT/receipts_gate_flash_256.txt"
