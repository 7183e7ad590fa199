#!/usr/bin/env bash
# Issue 10 (branch glue) on 2 x H200 (nvidia-h200-x2), <= 9.5 minutes: fewer launches per decode token.
#   phase 1, in parallel:
#     GPU 0: the step geometry kernel (kernels/geometry.py, GPU_CHECKED = False) and the door's verdict add
#            (kernels/door.py) against their references, then test_replay_gpu and test_pool under triton;
#     GPU 1: test_replay_gpu and test_pool under auto (geometry off: the door's change and the experts' path);
#   phase 2, both GPUs: flash decode, auto against triton (triton runs the geometry kernel): tok/s, and the
#     graph's kernel nodes per token per rank (issue 10's target <= 1,200; 1,936 before).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_glue_checks.sh
source benchmarks/gpu_env.sh
(
  export CUDA_VISIBLE_DEVICES=0 DSV4_KERNELS=triton
  timeout 60 python -m pytest -q -p no:cacheprovider tests/test_geometry_kernel.py tests/test_door_kernel.py \
    > "$OUT/pytest_geometry_door.txt" 2>&1
  echo "pytest rc=$? geometry+door (triton)" >> "$OUT/pytest_geometry_door.txt"
  timeout 170 python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py \
    > "$OUT/pytest_replay_pool_triton.txt" 2>&1
  echo "pytest rc=$? DSV4_KERNELS=triton" >> "$OUT/pytest_replay_pool_triton.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 200 python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py \
    > "$OUT/pytest_replay_pool_auto.txt" 2>&1
  echo "pytest rc=$? DSV4_KERNELS=auto" >> "$OUT/pytest_replay_pool_auto.txt"
) &
wait
for kernels in auto triton; do
  DSV4_KERNELS=$kernels timeout 150 python -m dsv4.cli bench --preset flash --device cuda --ranks 2 --prime 64 \
    --steps 32 --rows 2 > "$OUT/bench_flash_$kernels.txt" 2>&1
  echo "rc=$? DSV4_KERNELS=$kernels" >> "$OUT/bench_flash_$kernels.txt"
done
