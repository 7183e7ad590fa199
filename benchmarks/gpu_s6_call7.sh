#!/usr/bin/env bash
# Session 6, call 7 on 2 x H200 (nvidia-h200-x2), <= 7 minutes: batched decode reading each shared weight once for
# every row (qgemv v2_rows / dense rows, branch `rows`), the server's prefill chunk, the dequant kernel's tiles.
#   phase 1, in parallel:
#     GPU 0: tests/test_qgemv.py tests/test_dense_kernel.py tests/test_pool.py tests/test_replay_gpu.py on CUDA
#            (every row of a multi-row launch == that row alone; pooled batched == solo; graph == eager);
#     GPU 1: tests/test_prefill.py -k "host_sync or dense" on CUDA; prefill_moe_bench --dequant (dense arm, 4,096);
#   phase 2, both GPUs: batch_bench flash --pool at 1 and 16 rows (solo graph beside); the HTTP server on flash
#     at concurrency 1, 4, 16 (carry .whl).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s6_call7.sh
source benchmarks/gpu_env.sh
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 140 python -m pytest -q -p no:cacheprovider tests/test_qgemv.py tests/test_dense_kernel.py \
    tests/test_pool.py tests/test_replay_gpu.py > "$OUT/pytest_rows.txt" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_rows.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 40 python -m pytest -q -p no:cacheprovider tests/test_prefill.py -k "host_sync or dense" \
    > "$OUT/pytest_prefill_sync.txt" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_prefill_sync.txt"
  timeout 90 python benchmarks/prefill_moe_bench.py --tokens 4096 --arms dense --dequant > "$OUT/dequant_sweep.txt" 2>&1
  echo "rc=$?" >> "$OUT/dequant_sweep.txt"
) &
wait
timeout 100 python benchmarks/batch_bench.py flash --ranks 2 --pool --sizes 1 16 --steps 16 --rows 2 \
  > "$OUT/batch_flash_pool.txt" 2>&1
echo "rc=$?" >> "$OUT/batch_flash_pool.txt"
timeout 130 python benchmarks/serve_bench.py --preset flash --device cuda --ranks 2 --concurrency 1,4,16 \
  --prompt-tokens 64 --max-tokens 48 --level-timeout 25 > "$OUT/serve_flash.txt" 2>&1
echo "serve_bench rc=$?" >> "$OUT/serve_flash.txt"
