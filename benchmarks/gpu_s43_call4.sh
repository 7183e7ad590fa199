#!/usr/bin/env bash
# Session 43, call 4 (one H200): where a Flash rank's eager step spends its host time (issue 10's target 4: eager
# >= 12 tok/s; call 1's proxy: 8.6), against mini's per layer; then the rank proxy on main's defaults (ticket_norm on).
# Usage: OUT=dir bash benchmarks/gpu_s43_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=60
step 150 "$OUT/eager_host_flash.txt" python benchmarks/eager_host_profile.py --preset flash --proxy-world 2 \
  --steps 8 --top 45
step 100 "$OUT/eager_host_mini.txt" python benchmarks/eager_host_profile.py --preset mini --steps 16 --top 45
step 150 "$OUT/proxy.txt" python benchmarks/rank_proxy.py --preset flash --world 2 --steps 64 --rows 3 \
  --eager-steps 8 --profile
