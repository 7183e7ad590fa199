#!/usr/bin/env bash
# Session 17 call 2 (nvidia-h200, one GPU, <= 9 min): qgemv v2's tile loop unrolled by default and the new tiles by
# shape (64-row blocks, one tile a program, for a Flash rank's wo_a / wo_b; 32-row blocks for mini's wo_b):
# test_qgemv's CUDA cases whole; graph == eager, batched / pooled == solo; the pair kernels (moe.py's shared FP8
# rows); mini's kernels a token; mini's solo graph, DSV4_PDL 0 then 1.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s17_call2.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
step 130 "$OUT/pytest_qgemv.txt" python -m pytest -q -p no:cacheprovider tests/test_qgemv.py
step 110 "$OUT/pytest_replay_pool.txt" python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py
step 50 "$OUT/pytest_moe_decode.txt" python -m pytest -q -x -p no:cacheprovider tests/test_moe_decode.py
step 80 "$OUT/kernel_table_mini.txt" python benchmarks/kernel_table.py --preset mini --steps 16
step 70 "$OUT/bench_mini.txt" python -m dsv4.cli bench --preset mini --device cuda --ranks 1 --prime 64 --steps 64 --rows 3
left=$((530 - SECONDS))
if [ $left -gt 30 ]; then
  DSV4_PDL=1 step $((left > 60 ? 60 : left)) "$OUT/bench_mini_pdl.txt" python -m dsv4.cli bench --preset mini \
    --device cuda --ranks 1 --prime 64 --steps 64 --rows 3
fi
