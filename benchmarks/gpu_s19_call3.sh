#!/usr/bin/env bash
# Session 19, call 3 on one H200 (<= 8 min): DSV4_L2_PREFETCH=1 (dsv4.kernels.prefetch: wo_a into L2 during the
# norms/rope/attention, the router's and shared expert's weights during the mHC boundary, the next layer's query
# projections during its boundary, each from a side stream), off by default:
#   1. mini's bench interleaved: defaults / prefetch / defaults / prefetch (the pipelined arm is the measure);
#   2. tests/test_prefetch.py (graph and pipelined == eager with it on) and tests/test_generation_gpu.py;
#   3. kernel_table --sequence with it on.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s19_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=6
BENCH="python -m dsv4.cli bench --preset mini --device cuda --ranks 1 --prime 64 --steps 64 --rows 3"
step 120 "$OUT/bench_mini_1_default.txt" $BENCH
DSV4_L2_PREFETCH=1 step 60 "$OUT/bench_mini_2_prefetch.txt" $BENCH
step 45 "$OUT/bench_mini_3_default.txt" $BENCH
DSV4_L2_PREFETCH=1 step 45 "$OUT/bench_mini_4_prefetch.txt" $BENCH
step 100 "$OUT/pytest_prefetch_generation.txt" python -m pytest -q -p no:cacheprovider tests/test_prefetch.py \
  tests/test_generation_gpu.py
left=$((440 - SECONDS))
[ $left -gt 30 ] && DSV4_L2_PREFETCH=1 step $left "$OUT/kernel_table_prefetch.txt" \
  python benchmarks/kernel_table.py --preset mini --device cuda --steps 16 --top 45 --sequence
