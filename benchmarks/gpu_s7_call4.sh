#!/usr/bin/env bash
# Session 7, call 4 (nvidia-h200-x2, <= 8 min): branch bprefill merged (tree s7c). benchmarks/gpu_bprefill_checks.sh's
# CUDA tests (v2 and v3 in parallel), prefill_batch_bench flash v2 then v3, serve_bench flash concurrency 1 and 16
# with v3 on, then the solo flash decode bench under the defaults.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s7_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
V3="DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3"
(
  export CUDA_VISIBLE_DEVICES=0 DSV4_KERNELS=triton
  timeout 95 python -m pytest -q -p no:cacheprovider tests/test_prefill_batch.py tests/test_prefill.py \
    -k "prefill_batch or short_chunk or host_sync" > "$OUT/pytest_prefill_batch_v2.txt" 2>&1
  echo "pytest rc=$? DSV4_KERNELS=triton (v2 GEMVs)" >> "$OUT/pytest_prefill_batch_v2.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1 DSV4_KERNELS=triton DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3
  timeout 95 python -m pytest -q -p no:cacheprovider tests/test_prefill_batch.py \
    > "$OUT/pytest_prefill_batch_v3.txt" 2>&1
  echo "pytest rc=$? DSV4_KERNELS=triton DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3" >> "$OUT/pytest_prefill_batch_v3.txt"
) &
wait
timeout 90 python benchmarks/prefill_batch_bench.py flash --ranks 2 --states 16 --tokens 63 --runs 2 \
  > "$OUT/prefill_batch_flash_v2.txt" 2>&1
echo "rc=$? (v2 GEMVs)" >> "$OUT/prefill_batch_flash_v2.txt"
timeout 90 env $V3 python benchmarks/prefill_batch_bench.py flash --ranks 2 --states 16 --tokens 63 --runs 2 \
  > "$OUT/prefill_batch_flash_v3.txt" 2>&1
echo "rc=$? $V3" >> "$OUT/prefill_batch_flash_v3.txt"
timeout 110 env $V3 python benchmarks/serve_bench.py --preset flash --device cuda --ranks 2 --concurrency 1,16 \
  --prompt-tokens 64 --max-tokens 64 --level-timeout 20 > "$OUT/serve_flash_v3.txt" 2>&1
echo "serve_bench rc=$? $V3" >> "$OUT/serve_flash_v3.txt"
timeout 65 python -m dsv4.cli bench --preset flash --device cuda --ranks 2 --prime 64 --steps 32 --rows 2 \
  > "$OUT/bench_flash.txt" 2>&1
echo "bench rc=$? defaults" >> "$OUT/bench_flash.txt"
