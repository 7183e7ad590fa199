#!/usr/bin/env bash
# Session 44, call 4 (one H200): ncu on a Flash rank's one-token decode step (benchmarks/proxy_steps.py: the rank
# proxy's eager steps), main's defaults: the mHC boundary, the experts' kernels 1 and 2, the router, the GEMVs and the
# attention kernels of ~2 layers of a warm step, each launch alone (ncu serialises them): DRAM throughput, occupancy,
# waves, stall reasons. Where the fixed costs measured in calls 1-3 sit, for the next kernel design.
# Usage: OUT=dir bash benchmarks/gpu_s44_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=60
step 420 "$OUT/ncu_flash_rank.txt" ncu --clock-control none \
  --kernel-name regex:"_boundary_kernel|_gl_kernel|_gate_route_kernel|_qgemv2_kernel|_attn_split_kernel|_attn_combine_kernel|_q_kv_norms_kernel" \
  --launch-skip 2900 --launch-count 28 --section SpeedOfLight --section LaunchStats --section Occupancy \
  --section WarpStateStats --section SchedulerStats python benchmarks/proxy_steps.py --steps 8
