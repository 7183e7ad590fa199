#!/usr/bin/env bash
# Session 10 call 1 (nvidia-h200-x2, <= 3 min): where flash's eager step spends its host time (issue 10 target 4),
# rank 0 under cProfile with 2 spawned ranks.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s10_call1.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=80
timeout 170 python benchmarks/eager_host_profile.py --preset flash --ranks 2 --steps 16 --top 60 \
  > "$OUT/eager_host_flash.txt" 2>&1; echo "rc=$?" >> "$OUT/eager_host_flash.txt"
