#!/usr/bin/env bash
# Session 32, call 1 (one H200, ~5 min), main at session 31's end (739739c):
#   1. qgemv v3's row tiles (off by default since session 31, bits proven on the GPU, speed never measured): a
#      concurrency-16 prefill wave (16 chunks of 63 tokens) with 1 (default), 2 and 4 row tiles a program,
#      interleaved rounds, each arm's digest;
#   2. where a solo decode token's device time goes now, kernel by kernel, in launch order (kernel_table --sequence);
#   3. the same for the one-row batch graph (the pipelined decode's, what generate runs: batch_bench --profile 1).
# Usage: OUT=dir bash benchmarks/gpu_s32_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=25
step 170 "$OUT/prefill_wave_rt.txt" python benchmarks/prefill_batch_bench.py mini --tokens 63 --states 16 --runs 3 \
  --arm rt2=qgemv.v3_row_tiles=2 --arm rt4=qgemv.v3_row_tiles=4
step 80 "$OUT/kernel_table_mini.txt" python benchmarks/kernel_table.py --preset mini --device cuda --steps 16 --top 45 \
  --sequence
step 80 "$OUT/batch1_profile.txt" python benchmarks/batch_bench.py mini --sizes 1 --steps 32 --rows 3 --profile 1 \
  --top 45
