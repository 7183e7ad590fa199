#!/usr/bin/env bash
# Session 32, call 1 (one H200, ~9 min), branch s32-glue: main at session 31's end + _reduce_tile built from
# _store_partials and _sum_tile (the mend session 31 left on a branch that did not survive) + bookkeeping.CONFIG
# lean_prologue (on: a decode step's position a view of pos, the embedding gathered by the first mHC boundary;
# 3 launches fewer a solo step, the same bits on CPU):
#   1. the CUDA tests of the changed kernels: tests/test_dense_kernel.py, tests/test_qgemv.py's v3 and dense cases
#      (dense's and v3's kernels call the mended _reduce_tile; the early-tile oracle holds v3's loop to main's kernel
#      bit for bit), tests/test_hc_boundary.py (the gather against the gathered rows, lean on == off through the
#      model), tests/test_replay_gpu.py (graph == eager);
#   2. the gate on mini (replay == eager, refusals, batch identity) under the defaults (lean on);
#   3. decode_ab_bench: lean_prologue off against on (the default), graph and pipelined, one process;
#   4. qgemv v3's row tiles (off by default since session 31, bits proven, speed never measured): a concurrency-16
#      prefill wave (16 chunks of 63 tokens) with 1 (default), 2 and 4 row tiles a program, each arm's digest.
# Usage: OUT=dir bash benchmarks/gpu_s32_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=25
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 190 "$OUT/pytest_changed.txt" python -m pytest -q -p no:cacheprovider -n 4 --dist loadfile --tb=short -rfE \
  -p pytest_failures tests/test_qgemv.py tests/test_dense_kernel.py tests/test_hc_boundary.py tests/test_replay_gpu.py \
  -k "v3 or dense or boundary or lean or gather or replay or graph or eager"
step 100 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 \
  --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini.txt"
step 140 "$OUT/decode_ab_lean.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm lean_off=bookkeeping.lean_prologue=0
step 150 "$OUT/prefill_wave_rt.txt" python benchmarks/prefill_batch_bench.py mini --tokens 63 --states 16 --runs 3 \
  --arm rt2=qgemv.v3_row_tiles=2 --arm rt4=qgemv.v3_row_tiles=4
