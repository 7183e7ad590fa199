#!/usr/bin/env bash
# Session 10 call 6 (nvidia-h200, one GPU, <= 3 min): the gate on mini at the seed's sizes (256/256) with DSV4_PDL=1,
# 1 rank, --batch 4: the whole protocol with the PDL edges in the replayed graph.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s10_call6.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
DSV4_PDL=1 timeout 170 python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 \
  --out "$OUT/receipts_gate_mini_256_pdl.txt" > "$OUT/gate_mini_256_pdl.txt" 2>&1
echo "gate rc=$?" >> "$OUT/gate_mini_256_pdl.txt"
