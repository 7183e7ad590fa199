#!/usr/bin/env bash
# Session 26 call 4 (one H200, <= 3 min: the session's last device seconds, after three refused starts): expert_groups' blocks form
# (DSV4_EXPERT_GROUPS_BLOCKS=1, off by default: programs of 32 pairs, each scanning the step's pairs twice; call 3's
# profile of the one-program form: 6.7 us a layer at 16 rows, 70 at 32, its tiles spilling).
#   1. the table's tests, both forms, and moe_gl's grouped ones (grouped against ungrouped bit for bit);
#   2. the server's pooled step at 32 rows profiled with it (the table's launch among its kernels);
#   3. ncu on the two expert kernels of a 16-token step, grouped (the second layer's: kernel 1 with the shared rows,
#      kernel 2): where their ~half of the bandwidth goes (issue slots or memory).
# Usage: OUT=dir bash benchmarks/gpu_s26_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 75 "$OUT/pytest_groups.txt" python -m pytest -q -p no:cacheprovider -rfE tests/test_expert_groups.py \
  tests/test_moe_gl.py -k "table or grouped or reference"
step 50 "$OUT/batch_mini_pool_blocks.txt" env DSV4_EXPERT_GROUPS_BLOCKS=1 DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 \
  python benchmarks/batch_bench.py mini --pool --sizes 32 --steps 32 --rows 3 --profile 32 --top 25
step 45 "$OUT/ncu_moe16.txt" ncu --clock-control none --kernel-name regex:_gl_kernel --launch-skip 2 --launch-count 2 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
  --section MemoryWorkloadAnalysis --section InstructionStats python benchmarks/moe_one.py --tokens 16
