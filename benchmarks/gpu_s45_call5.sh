#!/usr/bin/env bash
# Session 45 call 5: benchmarks/tlb_probe.py again (call 4's failed to compile: a non-constexpr arange bound).
# Usage: OUT=dir bash benchmarks/gpu_s45_call5.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=14
step 150 "$OUT/tlb_probe.txt" python benchmarks/tlb_probe.py
