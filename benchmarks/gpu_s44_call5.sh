#!/usr/bin/env bash
# Session 44, call 5 (one H200): moe_gl CONFIG stamps (a diagnostic, off by default: each program of a one-token
# step's kernels 1 and 2 writes its start / release / end): where kernel 1's ~17 us and kernel 2's ~9 us of a Flash
# rank's layer go inside the decode graph (benchmarks/moe_stamps.py), the same on mini's layers; then the gate on mini
# at main's defaults (the kernels' default launches now carry the stamps' parameter, None: their SASS is unchanged,
# tests/compile_kernels.py's digests).
# Usage: OUT=dir bash benchmarks/gpu_s44_call5.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=8
step 200 "$OUT/moe_stamps_flash.txt" python benchmarks/moe_stamps.py --preset flash --world 2 --steps 4
step 80 "$OUT/moe_stamps_mini.txt" python benchmarks/moe_stamps.py --preset mini --world 1 --steps 4
step 120 "$OUT/gate.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 --prime 64 \
  --output 64 --out "$OUT/receipts-gate.txt"
