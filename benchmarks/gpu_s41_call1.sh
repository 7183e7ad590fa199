#!/usr/bin/env bash
# For session 41 (built in session 40 with no device time left; never run on a GPU):
#   1. layout CONFIG batch_lean (DSV4_BATCH_LEAN=1, off: a batched step's counters add the active mask as it is, its
#      keep mask of B rows is the active mask itself; 3 torch launches fewer a step, each of which also breaks the PDL
#      chain): the pool and generation tests under it, and decode_ab's pipelined arm (generate's one-row batch graph)
#      against the defaults; flip it on if it gains and passes;
#   2. where the pipelined arm's one-row batch graph spends ~20 us a token more than the solo graph (session 40: 1,033
#      against 1,013 us): the batch graph's kernels at B = 1 (batch_bench --profile 1), beside call 2's solo table.
# Usage: OUT=dir bash benchmarks/gpu_s41_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 200 "$OUT/pytest_lean.txt" env DSV4_BATCH_LEAN=1 python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile \
  -rfE -p pytest_failures tests/test_generation_gpu.py tests/test_pool.py
step 170 "$OUT/decode_ab_lean.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm lean=layout.batch_lean=1
step 150 "$OUT/batch_kernels_b1.txt" python benchmarks/batch_bench.py mini --sizes 1 --rows 2 --profile 1 --top 60
