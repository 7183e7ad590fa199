#!/usr/bin/env bash
# Session 33, call 1 (one H200, ~4 min), main at the session's start + hc_boundary_bench --iters:
#   1. what the boundary finish's serial Sinkhorn costs: the fused boundary at 1 row, 20 iterations then 1 (timing
#      only; decides whether moving Sinkhorn off the critical path is worth building);
#   2. ncu on the two expert kernels of a one-token step (mini's shapes; where their 0.59 / 0.43 of the copy
#      bandwidth goes: issue, stalls, occupancy);
#   3. mini's kernel sequence a token as main runs it now (kernel_table --sequence: the baseline of this session).
# Usage: OUT=dir bash benchmarks/gpu_s33_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
step 90 "$OUT/boundary_iters20.txt" python benchmarks/hc_boundary_bench.py --rows 1 --arms 'fused_default$' --iters 20
step 60 "$OUT/boundary_iters1.txt" python benchmarks/hc_boundary_bench.py --rows 1 --arms 'fused_default$' --iters 1
step 90 "$OUT/ncu_moe1.txt" ncu --clock-control none --kernel-name regex:_gl_kernel --launch-skip 2 --launch-count 2 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
  --section MemoryWorkloadAnalysis --section LaunchStats python benchmarks/moe_one.py --tokens 1
step 120 "$OUT/kernel_table_mini.txt" python benchmarks/kernel_table.py --preset mini --device cuda --steps 16 --top 45 \
  --sequence
