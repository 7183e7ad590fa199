#!/usr/bin/env bash
# Session 7, call 1 (nvidia-h200-x2, <= 9.5 min): branches glue2 + tcgemv merged (tree s7).
#   phase A, in parallel (<= 270 s):
#     GPU 0: glue2 — the draw kernel (kernels/draw.py) and the shared add (DSV4_SHARED_ADD=1) against their
#            references; test_replay_gpu + test_pool with both on (graph == eager, batched == solo);
#     GPU 1: tcgemv — the v3 tensor-core GEMVs' CUDA tests (every row of B = 1/3/16/19 equals that row alone,
#            against float64 / the reference), then qgemv_bench --rows 1,16 (v2_rows8 against v3).
#   phase B, both GPUs (<= 300 s): the flash decode kernel table (glue2 on) and batch_bench flash --pool 16 with
#     v3 on, with its 16-row step's kernel table.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s7_call1.sh
source benchmarks/gpu_env.sh
V3="DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3"
(
  export CUDA_VISIBLE_DEVICES=0 DSV4_KERNELS=triton
  timeout 80 python -m pytest -q -p no:cacheprovider tests/test_draw_kernel.py tests/test_sampler.py \
    tests/test_qgemv.py -k "draw or sampler or shared_add or moe_decode" > "$OUT/pytest_draw_shared_add.txt" 2>&1
  echo "pytest rc=$? draw+shared_add (triton)" >> "$OUT/pytest_draw_shared_add.txt"
  DSV4_SHARED_ADD=1 timeout 180 python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py \
    > "$OUT/pytest_replay_pool_triton.txt" 2>&1
  echo "pytest rc=$? DSV4_KERNELS=triton DSV4_SHARED_ADD=1" >> "$OUT/pytest_replay_pool_triton.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 190 python -m pytest -q -p no:cacheprovider tests/test_qgemv.py tests/test_dense_kernel.py -k "v3" \
    > "$OUT/pytest_v3.txt" 2>&1
  echo "pytest rc=$? v3" >> "$OUT/pytest_v3.txt"
  timeout 70 python benchmarks/qgemv_bench.py --rows 1,16 --arms '^(v2_rows1|v2_rows8|v3_default|v3_n16)$' \
    > "$OUT/qgemv_rows.txt" 2>&1
  echo "rc=$?" >> "$OUT/qgemv_rows.txt"
) &
wait
DSV4_KERNELS=triton DSV4_SHARED_ADD=1 timeout 150 python benchmarks/kernel_table.py --preset flash --device cuda \
  --ranks 2 --steps 16 --top 45 > "$OUT/table_flash_glue2.txt" 2>&1
echo "kernel_table rc=$? DSV4_KERNELS=triton DSV4_SHARED_ADD=1" >> "$OUT/table_flash_glue2.txt"
timeout 140 env $V3 DSV4_KERNELS=triton DSV4_SHARED_ADD=1 python benchmarks/batch_bench.py flash --ranks 2 --pool \
  --sizes 1 16 --steps 16 --rows 2 --profile 16 --top 15 > "$OUT/batch_flash_pool_v3.txt" 2>&1
echo "rc=$? v3" >> "$OUT/batch_flash_pool_v3.txt"
