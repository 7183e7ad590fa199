#!/usr/bin/env bash
# Session 19, call 2 on one H200 (<= 9.5 min): moe_gl's new kernel forms, each behind a switch (off by default):
#   DSV4_MOE_DOWN_LOOP=1 (kernel 2 as one program a 16-row block looping over the experts), DSV4_MOE_DOWN_EARLY=1
#   (its products before its wait), DSV4_MOE_SHARED_EARLY=1 (kernel 1's shared programs first, their sums before
#   their wait); main's embedding gather as index_select (on in every arm).
#   1. tests/test_moe_gl.py's new cases (each form's bits against the ticketed / plain kernel);
#   2. mini's bench interleaved: defaults / LOOP / LOOP+DOWN_EARLY / all three / defaults;
#   3. kernel_table --sequence with all three (each kernel's advance).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s19_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=6
BENCH="python -m dsv4.cli bench --preset mini --device cuda --ranks 1 --prime 64 --steps 64 --rows 3"
step 100 "$OUT/pytest_moe_gl_new.txt" python -m pytest -q -p no:cacheprovider tests/test_moe_gl.py \
  -k "down_loop or shared_early"
step 120 "$OUT/bench_mini_1_default.txt" $BENCH
DSV4_MOE_DOWN_LOOP=1 step 60 "$OUT/bench_mini_2_loop.txt" $BENCH
DSV4_MOE_DOWN_LOOP=1 DSV4_MOE_DOWN_EARLY=1 step 55 "$OUT/bench_mini_3_loop_early.txt" $BENCH
DSV4_MOE_DOWN_LOOP=1 DSV4_MOE_DOWN_EARLY=1 DSV4_MOE_SHARED_EARLY=1 step 55 "$OUT/bench_mini_4_all.txt" $BENCH
step 45 "$OUT/bench_mini_5_default.txt" $BENCH
left=$((565 - SECONDS))
DSV4_MOE_DOWN_LOOP=1 DSV4_MOE_DOWN_EARLY=1 DSV4_MOE_SHARED_EARLY=1 step $left "$OUT/kernel_table_all.txt" \
  python benchmarks/kernel_table.py --preset mini --device cuda --steps 16 --top 45 --sequence
