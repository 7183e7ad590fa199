#!/usr/bin/env bash
# Session 18, call 1 (one H200, <= 9 min): kernels/hc_head.py's GPU check (DSV4_HC_HEAD=1: its CUDA tests, graph ==
# eager and pooled == solo under it), mini's solo graph A/B/A with it, DSV4_PDL=1 on today's chain, then session 17's
# unverified test change (tests/test_moe_options_gpu.py on moe.py's kernels).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s18_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=14
DSV4_HC_HEAD=1 step 120 "$OUT/pytest_hc_head.txt" python -m pytest -q -p no:cacheprovider -n 4 tests/test_hc_head.py \
  tests/test_replay_gpu.py tests/test_pool.py
BENCH="python -m dsv4.cli bench --preset mini --device cuda --ranks 1 --prime 64 --steps 64 --rows 3"
DSV4_HC_HEAD=0 step 70 "$OUT/bench_mini_a0.txt" $BENCH
DSV4_HC_HEAD=1 step 60 "$OUT/bench_mini_hc_head.txt" $BENCH
DSV4_HC_HEAD=0 step 60 "$OUT/bench_mini_a1.txt" $BENCH
DSV4_PDL=1 step 70 "$OUT/bench_mini_pdl1.txt" $BENCH
step 130 "$OUT/pytest_moe_options_gpu.txt" python -m pytest -q -p no:cacheprovider tests/test_moe_options_gpu.py
