#!/usr/bin/env bash
# Session 11 call 4 (nvidia-h200, one GPU, <= 4 min), main: where a batched step's time goes on mini (issue 12: the
# server's 16-row steps take ~13.8 ms against a solo step's 1.6 ms). batch_bench at 1, 4 and 16 rows, plain and
# pooled states, with the kernel table of the pooled 16-row step (kernels per step, their time, by name).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s11_call4.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=60
step 200 "$OUT/batch_mini.txt" python benchmarks/batch_bench.py mini --sizes 1 4 16 --steps 32 --rows 2 --pool \
  --profile 16 --top 40
