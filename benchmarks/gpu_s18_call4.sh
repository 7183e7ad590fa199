#!/usr/bin/env bash
# Session 18, call 4 (one H200, <= 7 min): call 3's 12 failures after their fix (tests/v3_main.py patched qgemv.PDL,
# which the kernels no longer read; test_hc_head's default), then mini's solo graph interleaved: defaults (DSV4_PDL
# on, every kernel in the chain) / DSV4_PDL=0 / defaults / DSV4_PDL=0 / defaults (call 3's one pair disagreed with
# call 2's).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s18_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
step 90 "$OUT/pytest_fixed.txt" python -m pytest -q -p no:cacheprovider -n 4 tests/test_hc_head.py \
  tests/test_dense_kernel.py tests/test_qgemv.py -k "early or default or switch or hc_head"
BENCH="python -m dsv4.cli bench --preset mini --device cuda --ranks 1 --prime 64 --steps 64 --rows 3"
step 75 "$OUT/bench_1_default.txt" $BENCH
DSV4_PDL=0 step 75 "$OUT/bench_2_pdl0.txt" $BENCH
step 50 "$OUT/bench_3_default.txt" $BENCH
DSV4_PDL=0 step 50 "$OUT/bench_4_pdl0.txt" $BENCH
step 50 "$OUT/bench_5_default.txt" $BENCH
