#!/usr/bin/env bash
# Session 26 call 4 (one H200, <= 8 min): expert_groups' table in programs of 32 pairs, each scanning the step's
# pairs twice (call 3's profile: the one-program form 6.7 us a layer at 16 rows, 70 at 32, its tiles spilling).
#   1. the table's tests and moe_gl's (grouped against ungrouped bit for bit);
#   2. the gate on mini (its batch of 4 grouped);
#   3. the server on mini at concurrency 1 / 16 / 32 (IDENTITY);
#   4. the server's pooled step at 16 and 32 rows profiled;
#   5. ncu on the two expert kernels of a 16-token step (grouped).
# Usage: OUT=dir bash benchmarks/gpu_s26_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 100 "$OUT/pytest_groups.txt" python -m pytest -q -p no:cacheprovider -rfE tests/test_expert_groups.py \
  tests/test_moe_gl.py -k "table or grouped or gluon_experts or reference"
step 90 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 --prime 64 \
  --output 64 --out "$OUT/receipts-gate-mini.txt"
step 70 "$OUT/serve_mini.txt" python benchmarks/serve_bench.py --preset mini --device cuda --concurrency 1,16,32 \
  --prompt-tokens 64 --max-tokens 64 --warmup 1
step 75 "$OUT/batch_mini_pool.txt" env DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 python benchmarks/batch_bench.py mini --pool \
  --sizes 16 32 --steps 32 --rows 3 --profile 16 32 --top 25
# ncu on the experts' kernels of a 16-token step, grouped (the second layer's: kernel 1 with the shared rows, kernel 2):
# where their ~half of the bandwidth goes (issue slots or memory)
step 60 "$OUT/ncu_moe16.txt" ncu --clock-control none --kernel-name regex:_gl_kernel \
  --launch-skip 2 --launch-count 2 --section SpeedOfLight --section Occupancy --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis --section InstructionStats \
  python benchmarks/moe_one.py --tokens 16
