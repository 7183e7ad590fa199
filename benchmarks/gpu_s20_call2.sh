#!/usr/bin/env bash
# Session 20 call 2 (one H200): the TMA-fed FP8 GEMV (dsv4/kernels/qgemv_tma.py, DSV4_QGEMV_TMA, off by default)
# against v2 on mini's (Flash world 1) stored FP8 weights at 1 and 4 rows; its tests with the switch on (qgemv's
# CUDA cases, graph == eager over mini); then mini's bench off and on in one call, the on arm at the fastest
# layer arm of the first step.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s20_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
step 180 "$OUT/qgemv_tma_world1.txt" python benchmarks/qgemv_tma_bench.py --world 1 --rows 1,4
best=$(grep '^QGEMV_TMA_BEST' "$OUT/qgemv_tma_world1.txt" | grep '"rows":1,' | sed 's/.*"arm":"tma_n\([0-9]*\)_s\([0-9]*\)".*/\1 \2/')
read -r BN ST <<< "${best:-16 8}"
echo "best block_n=$BN stages=$ST" > "$OUT/chosen.txt"
export DSV4_QGEMV_TMA_BLOCK_N=$BN DSV4_QGEMV_TMA_STAGES=$ST
step 130 "$OUT/pytest_tma.txt" env DSV4_QGEMV_TMA=1 python -m pytest -q -p no:cacheprovider -x -rfE \
  tests/test_qgemv.py tests/test_replay_gpu.py
step 110 "$OUT/bench_mini_default.txt" python -m dsv4.cli bench --preset mini --device cuda --ranks 1 --prime 64 \
  --steps 64 --rows 3
step 110 "$OUT/bench_mini_tma.txt" env DSV4_QGEMV_TMA=1 python -m dsv4.cli bench --preset mini --device cuda \
  --ranks 1 --prime 64 --steps 64 --rows 3
