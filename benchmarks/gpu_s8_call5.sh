#!/usr/bin/env bash
# Session 8, call 5 (nvidia-h200-x2, <= 4 min): main's final form (kernel 2's expert split only for launches of at
# most 4 tokens): the MoE option tests, tests/test_pool.py whole (its launch count now names the ops that differ),
# flash decode under the defaults.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s8_call5.sh
source benchmarks/gpu_env.sh
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 100 python -m pytest -q -p no:cacheprovider tests/test_pool.py > "$OUT/pytest_pool.txt" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_pool.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 100 python -m pytest -q -p no:cacheprovider tests/test_moe_options_gpu.py tests/test_qgemv.py \
    -k "options or paired or routed_and_shared or moe_decode" > "$OUT/pytest_moe.txt" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_moe.txt"
) &
wait
timeout 75 python -m dsv4.cli bench --preset flash --device cuda --ranks 2 --prime 64 --steps 32 --rows 2 \
  > "$OUT/bench_flash.txt" 2>&1; echo "rc=$? defaults" >> "$OUT/bench_flash.txt"
