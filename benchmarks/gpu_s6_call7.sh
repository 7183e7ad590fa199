#!/usr/bin/env bash
# Session 6, call 7 on 2 x H200 (nvidia-h200-x2), <= 7.2 minutes: batched decode reading each shared weight once
# for every row (qgemv v2_rows / dense rows), fewer glue launches per decode step, short prefill chunks on the pair
# kernels, the server's prefill chunk, the dequant kernel's tiles.
#   phase 1, in parallel:
#     GPU 0: tests/test_qgemv.py tests/test_dense_kernel.py tests/test_pool.py tests/test_replay_gpu.py on CUDA
#            (every row of a multi-row launch == that row alone; pooled batched == solo; graph == eager);
#     GPU 1: tests/test_prefill.py (host sync, dense choice, short chunks) on CUDA; prefill_moe_bench (pairs, dense,
#            the FP4 kernel at 16-4,096 tokens; the dequant sweep);
#   phase 2, both GPUs: flash decode (dsv4 bench); batch_bench flash --pool at 16 rows; flash prefill at 64 / 128 /
#     512 / 4,096 tokens; the HTTP server on flash at concurrency 1, 4, 16 (carry .whl).
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
  timeout 45 python -m pytest -q -p no:cacheprovider tests/test_prefill.py -k "host_sync or dense or short_chunk" \
    > "$OUT/pytest_prefill_short.txt" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_prefill_short.txt"
  timeout 90 python benchmarks/prefill_moe_bench.py --tokens 16,64,128,256,4096 --arms "pairs|dense|^base$|k64_w4" \
    --dequant > "$OUT/prefill_moe_bench.txt" 2>&1
  echo "rc=$?" >> "$OUT/prefill_moe_bench.txt"
) &
wait
timeout 65 python -m dsv4.cli bench --preset flash --device cuda --ranks 2 --prime 64 --steps 32 --rows 2 \
  > "$OUT/bench_flash.txt" 2>&1
echo "bench rc=$?" >> "$OUT/bench_flash.txt"
timeout 75 python benchmarks/batch_bench.py flash --ranks 2 --pool --sizes 16 --steps 16 --rows 2 \
  > "$OUT/batch_flash_pool16.txt" 2>&1
echo "rc=$?" >> "$OUT/batch_flash_pool16.txt"
timeout 60 python benchmarks/prefill_bench.py flash --sizes 64 128 512 4096 --runs 3 --eager-steps 0 --graph-steps 0 \
  --no-hf > "$OUT/prefill_flash_short.txt" 2>&1
echo "rc=$?" >> "$OUT/prefill_flash_short.txt"
timeout 90 python benchmarks/serve_bench.py --preset flash --device cuda --ranks 2 --concurrency 1,4,16 \
  --prompt-tokens 64 --max-tokens 64 --level-timeout 20 > "$OUT/serve_flash.txt" 2>&1
echo "serve_bench rc=$?" >> "$OUT/serve_flash.txt"
