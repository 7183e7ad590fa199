#!/usr/bin/env bash
# Session 31's call 3 (one H200, ~5 min), branch s31-v3rt (main + qgemv v3's row tiles a program, 1 by default, and
# s30-review's import mend; call 2 ran the whole GPU suite with both in its tree, where only the early-tile oracle
# test failed, for want of the RT argument in tests/v3_main.py):
#   1. tests/test_qgemv.py's v3 cases (the early-tile oracle: the restructured loop against main's kernel, bit for
#      bit; 2 and 4 row tiles against each row alone) and tests/test_dense_kernel.py;
#   2. a concurrency-16 prefill wave (16 chunks of 63 tokens: 63 row tiles a v3 GEMV) with 1 (the default), 2 and 4
#      row tiles a program, interleaved rounds, each arm's digest (the same bits, or the arm is wrong);
#   3. the gate on mini.
# Usage: OUT=dir bash benchmarks/gpu_s31_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 90 "$OUT/pytest_v3.txt" python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --tb=short -rfE \
  tests/test_qgemv.py tests/test_dense_kernel.py -k "v3"
step 80 "$OUT/prefill_wave_rt.txt" python benchmarks/prefill_batch_bench.py mini --tokens 63 --states 16 --runs 3 \
  --arm rt2=qgemv.v3_row_tiles=2 --arm rt4=qgemv.v3_row_tiles=4
step 90 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 \
  --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini.txt"
