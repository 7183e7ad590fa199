#!/usr/bin/env bash
# Session 10 call 3a (nvidia-h200, one GPU, <= 6 min; the 2-GPU machine was not lent), branch s10 = main + p2p +
# pdlw: DSV4_PDL=1 under the replay and pool tests, the side lane's test, one Flash layer's GEMVs with PDL off and on
# (qgemv_bench: graphs of back-to-back launches), then mini decode (1 rank, 3 rows of 128): defaults, DSV4_PDL=1,
# DSV4_OVERLAP=1, both.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s10_call3a.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
DSV4_PDL=1 timeout 150 python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py \
  tests/test_lanes.py > "$OUT/pytest_pdl_lanes.txt" 2>&1; echo "pytest rc=$?" >> "$OUT/pytest_pdl_lanes.txt"
for pdl in 0 1; do
  DSV4_PDL=$pdl timeout 45 python benchmarks/qgemv_bench.py --arms "^v2_default\$" \
    > "$OUT/qgemv_bench_pdl$pdl.txt" 2>&1; echo "rc=$? DSV4_PDL=$pdl" >> "$OUT/qgemv_bench_pdl$pdl.txt"
done
for arm in "default" "pdl DSV4_PDL=1" "overlap DSV4_OVERLAP=1" "both DSV4_PDL=1 DSV4_OVERLAP=1"; do
  set -- $arm
  name=$1; shift
  env "$@" timeout 50 python -m dsv4.cli bench --preset mini --device cuda --ranks 1 --prime 64 --steps 128 --rows 3 \
    > "$OUT/bench_mini_$name.txt" 2>&1; echo "rc=$?" >> "$OUT/bench_mini_$name.txt"
done
