#!/usr/bin/env bash
# Session 45 call 6: benchmarks/tlb_probe.py with its cold_touched pattern (each launch makes the next launch's region's
# page translations ahead: does that take back call 5's ~2 us past 8 GiB?).
# Usage: OUT=dir bash benchmarks/gpu_s45_call6.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
step 150 "$OUT/tlb_probe.txt" python benchmarks/tlb_probe.py
