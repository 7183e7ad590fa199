#!/usr/bin/env bash
# Issue 10 (branch glue2) on 2 x H200 (nvidia-h200-x2), <= 9 minutes: fewer launches per decode token.
#   phase 1, in parallel:
#     GPU 0: the new draw kernel (kernels/draw.py, GPU_CHECKED = False) and the routed down kernel's shared add
#            (kernels/moe.py CONFIG shared_add, off by default; DSV4_SHARED_ADD=1 turns it on) against their
#            references, then test_replay_gpu and test_pool with both on (DSV4_KERNELS=triton DSV4_SHARED_ADD=1);
#     GPU 1: test_replay_gpu and test_pool under auto (the top-k picks and the sampler's masked_fill: always on);
#   phase 2, both GPUs: flash decode, auto against triton + shared add: tok/s and the graph's kernel nodes per
#     token per rank (issue 10's target <= 1,200; 1,495 at main be5b519; expected ~1,474 auto, ~1,411 both on).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_glue2_checks.sh
source benchmarks/gpu_env.sh
(
  export CUDA_VISIBLE_DEVICES=0 DSV4_KERNELS=triton
  timeout 90 python -m pytest -q -p no:cacheprovider tests/test_draw_kernel.py tests/test_sampler.py \
    tests/test_qgemv.py -k "draw or sampler or shared_add or moe_decode" > "$OUT/pytest_draw_shared_add.txt" 2>&1
  echo "pytest rc=$? draw+shared_add (triton)" >> "$OUT/pytest_draw_shared_add.txt"
  DSV4_SHARED_ADD=1 timeout 170 python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py \
    > "$OUT/pytest_replay_pool_triton.txt" 2>&1
  echo "pytest rc=$? DSV4_KERNELS=triton DSV4_SHARED_ADD=1" >> "$OUT/pytest_replay_pool_triton.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 200 python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py \
    > "$OUT/pytest_replay_pool_auto.txt" 2>&1
  echo "pytest rc=$? DSV4_KERNELS=auto" >> "$OUT/pytest_replay_pool_auto.txt"
) &
wait
DSV4_KERNELS=auto timeout 150 python -m dsv4.cli bench --preset flash --device cuda --ranks 2 --prime 64 \
  --steps 32 --rows 2 > "$OUT/bench_flash_auto.txt" 2>&1
echo "rc=$? DSV4_KERNELS=auto" >> "$OUT/bench_flash_auto.txt"
DSV4_KERNELS=triton DSV4_SHARED_ADD=1 timeout 150 python -m dsv4.cli bench --preset flash --device cuda --ranks 2 \
  --prime 64 --steps 32 --rows 2 > "$OUT/bench_flash_triton_shared_add.txt" 2>&1
echo "rc=$? DSV4_KERNELS=triton DSV4_SHARED_ADD=1" >> "$OUT/bench_flash_triton_shared_add.txt"
