#!/usr/bin/env bash
# Session 30, call 3 (one H200, <= 8 min):
#   1. tests/test_prefill_graphs.py on tiny, stopping at the first failure with its traceback (call 2: tiny's 16-token
#      case passed, its other four failed, the output cut before the reasons);
#   2. v3's row tiles first (qgemv CONFIG v3_rows_first, new): the v3 tests of test_qgemv.py / test_dense_kernel.py;
#   3. the concurrency-16 prefill wave (16 x 63 tokens) and one 63-token chunk, row tiles first against the old order,
#      one process, interleaved rounds;
#   4. tests/test_prefill_graphs.py on mini.
# Usage: OUT=dir bash benchmarks/gpu_s30_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=60
step 100 "$OUT/pytest_prefill_graphs_tiny.txt" python -m pytest -q -p no:cacheprovider -x --tb=short -rfE \
  tests/test_prefill_graphs.py -k tiny
step 80 "$OUT/pytest_v3_order.txt" python -m pytest -q -p no:cacheprovider -rfE tests/test_qgemv.py \
  tests/test_dense_kernel.py -k "v3"
PB="python benchmarks/prefill_batch_bench.py mini --tokens 63 --arm old=qgemv.v3_rows_first=0"
step 90 "$OUT/prefill_ab_16_order.txt" $PB --states 16 --runs 5
step 50 "$OUT/prefill_ab_1_order.txt" $PB --states 1 --runs 7
step 140 "$OUT/pytest_prefill_graphs_mini.txt" python -m pytest -q -p no:cacheprovider --tb=short -rfE \
  tests/test_prefill_graphs.py -k mini
