#!/usr/bin/env bash
# Session 32, call 1 (one H200, ~6 min), branch s32-review (main at session 31's end + _reduce_tile built from
# _store_partials and _sum_tile, the mend session 31 left on a branch that did not survive):
#   0. tests/test_dense_kernel.py and tests/test_qgemv.py's v3 cases (dense's and v3's kernels call the mended
#      _reduce_tile; the early-tile oracle holds v3's loop to main's kernel bit for bit);
#   1. qgemv v3's row tiles (off by default since session 31, bits proven on the GPU, speed never measured): a
#      concurrency-16 prefill wave (16 chunks of 63 tokens) with 1 (default), 2 and 4 row tiles a program,
#      interleaved rounds, each arm's digest;
#   2. where a solo decode token's device time goes now, kernel by kernel, in launch order (kernel_table --sequence);
#   3. the same for the one-row batch graph (the pipelined decode's, what generate runs: batch_bench --profile 1).
# Usage: OUT=dir bash benchmarks/gpu_s32_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=25
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 170 "$OUT/pytest_reduce.txt" python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --tb=short -rfE \
  -p pytest_failures tests/test_qgemv.py tests/test_dense_kernel.py -k "v3 or dense"
step 170 "$OUT/prefill_wave_rt.txt" python benchmarks/prefill_batch_bench.py mini --tokens 63 --states 16 --runs 3 \
  --arm rt2=qgemv.v3_row_tiles=2 --arm rt4=qgemv.v3_row_tiles=4
step 80 "$OUT/kernel_table_mini.txt" python benchmarks/kernel_table.py --preset mini --device cuda --steps 16 --top 45 \
  --sequence
step 80 "$OUT/batch1_profile.txt" python benchmarks/batch_bench.py mini --sizes 1 --steps 32 --rows 3 --profile 1 \
  --top 45
