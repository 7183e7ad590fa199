#!/usr/bin/env bash
# Session 25 call 6 (one H200, ~3.5 min): where a 16-row batched step goes on the server's GEMVs (v3), the next
# session's map for concurrency 16 (issue 12: x4.36 concurrency 1 at call 5); mini's solo decode on the landed tree.
# Usage: OUT=dir bash benchmarks/gpu_s25_call6.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=45
step 120 "$OUT/batch_mini_v3.txt" env DSV4_QGEMV=v3 python benchmarks/batch_bench.py mini --sizes 1 16 --steps 32 \
  --rows 3 --profile 16 --top 25
step 75 "$OUT/bench_mini.txt" python -m dsv4.cli bench --preset mini --prime 64 --steps 64 --rows 3 --profile
