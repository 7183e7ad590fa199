#!/usr/bin/env bash
# Session 18, call 3 (one H200, <= 9.5 min): the defaults (DSV4_PDL on where every GPU is sm_90+: every
# kernel launched with launch_pdl; DSV4_HC_HEAD on): every test file with CUDA cases (benchmarks/gpu_suite_one.sh,
# 5 workers), then mini's solo graph under the defaults and with DSV4_PDL=0.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s18_call3.sh   (carry .whl)
SUITE_LIMIT=480 source benchmarks/gpu_suite_one.sh
SUMMARY_LINES=40
python -c "import dsv4.kernels as k; print('PDL', k.PDL)" > "$OUT/pdl_default.txt" 2>&1
left=$((560 - SECONDS))
if [ $left -gt 40 ]; then
  step $((left / 2)) "$OUT/bench_mini_default.txt" python -m dsv4.cli bench --preset mini --device cuda --ranks 1 \
    --prime 64 --steps 64 --rows 3
  DSV4_PDL=0 step $((left / 2)) "$OUT/bench_mini_pdl0.txt" python -m dsv4.cli bench --preset mini --device cuda \
    --ranks 1 --prime 64 --steps 64 --rows 3
fi
