#!/usr/bin/env bash
# Session 6, call 7 on 2 x H200 (nvidia-h200-x2), <= 7 minutes: batched decode reading each shared weight once for
# every row (qgemv v2_rows / dense rows: branch rows), fewer launches per decode step (the step geometry kernel, the
# door's verdict add, the experts' path without masking: branch glue), short prefill chunks on the pair kernels,
# the server's prefill chunk. DSV4_KERNELS=triton = the default kernels + the one unchecked module (geometry).
#   phase 1, in parallel:
#     GPU 0 (triton): tests/test_geometry_kernel.py test_door_kernel.py test_replay_gpu.py test_pool.py;
#     GPU 1 (auto): tests/test_qgemv.py test_dense_kernel.py, test_prefill.py -k "host_sync or dense or short_chunk";
#   phase 2, both GPUs, triton: flash decode (dsv4 bench); batch_bench flash --pool at 16 rows; flash prefill at
#     64 / 128 / 4,096 tokens; the HTTP server on flash at concurrency 1 and 16 (carry .whl).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s6_call7.sh
source benchmarks/gpu_env.sh
(
  export CUDA_VISIBLE_DEVICES=0 DSV4_KERNELS=triton
  timeout 130 python -m pytest -q -p no:cacheprovider tests/test_geometry_kernel.py tests/test_door_kernel.py \
    tests/test_replay_gpu.py tests/test_pool.py > "$OUT/pytest_triton.txt" 2>&1
  echo "pytest rc=$? DSV4_KERNELS=triton" >> "$OUT/pytest_triton.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 95 python -m pytest -q -p no:cacheprovider tests/test_qgemv.py tests/test_dense_kernel.py \
    > "$OUT/pytest_rows.txt" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_rows.txt"
  timeout 35 python -m pytest -q -p no:cacheprovider tests/test_prefill.py -k "host_sync or dense or short_chunk" \
    > "$OUT/pytest_prefill_short.txt" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_prefill_short.txt"
) &
wait
export DSV4_KERNELS=triton
timeout 65 python -m dsv4.cli bench --preset flash --device cuda --ranks 2 --prime 64 --steps 32 --rows 2 \
  > "$OUT/bench_flash.txt" 2>&1
echo "bench rc=$?" >> "$OUT/bench_flash.txt"
timeout 90 python benchmarks/batch_bench.py flash --ranks 2 --pool --sizes 16 --steps 16 --rows 2 \
  > "$OUT/batch_flash_pool16.txt" 2>&1
echo "rc=$?" >> "$OUT/batch_flash_pool16.txt"
timeout 50 python benchmarks/prefill_bench.py flash --sizes 64 128 4096 --runs 3 --eager-steps 0 --graph-steps 0 \
  --no-hf > "$OUT/prefill_flash_short.txt" 2>&1
echo "rc=$?" >> "$OUT/prefill_flash_short.txt"
timeout 70 python benchmarks/serve_bench.py --preset flash --device cuda --ranks 2 --concurrency 1,16 \
  --prompt-tokens 64 --max-tokens 64 --level-timeout 15 > "$OUT/serve_flash.txt" 2>&1
echo "serve_bench rc=$?" >> "$OUT/serve_flash.txt"
