#!/usr/bin/env bash
# Session 10 call 4 (nvidia-h200, one GPU, <= 4 min): main with pdlw merged (DSV4_PDL off; the GEMVs' early-tile
# loops on by default) under the defaults: the replay, pool, profile and GEMV tests; then mini's bench --profile with
# DSV4_PDL=1 (the graph-timed phases on one rank: no collective waits).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s10_call4.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=20
timeout 170 python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py tests/test_profile.py \
  tests/test_qgemv.py tests/test_dense_kernel.py > "$OUT/pytest_defaults.txt" 2>&1
echo "pytest rc=$?" >> "$OUT/pytest_defaults.txt"
DSV4_PDL=1 timeout 60 python -m dsv4.cli bench --preset mini --device cuda --ranks 1 --prime 64 --steps 64 --rows 2 \
  --profile > "$OUT/bench_mini_profile_pdl.txt" 2>&1; echo "rc=$?" >> "$OUT/bench_mini_profile_pdl.txt"
