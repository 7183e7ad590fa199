#!/usr/bin/env bash
# Session 35, call 4 (the warm machine of call 3, the same tree): the gate on mini under the defaults (the stream
# against sessions 30-34's 6dd64d77), decode_ab on mini (the defaults against the early pools off) and the kernel
# table under the defaults.
# Usage: OUT=dir bash benchmarks/gpu_s35_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=25
step 100 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 --prime 64 \
  --output 64 --out "$OUT/receipts-gate-mini.txt"
step 150 "$OUT/decode_ab.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm pool_off=compressor.early=0
step 80 "$OUT/kernel_table.txt" python benchmarks/kernel_table.py --preset mini --device cuda --steps 16 --sequence \
  --top 40
