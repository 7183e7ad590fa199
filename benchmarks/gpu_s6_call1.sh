#!/usr/bin/env bash
# Session 6, call 1 on 2 x H200 (nvidia-h200-x2), <= 9.5 minutes: the levers left off in session 5 checked and
# timed on the integration tree (main + hcfuse + idxskip + measure-ranges). Outputs under $RES, returned as
# $OUT/results.tgz + $OUT/summary.txt.
#   phase 1, in parallel:
#     GPU 0: replay identity + qgemv tests with the split sums fused into the GEMV (DSV4_FUSED_SPLIT_SUM=1);
#     GPU 1: the fused mHC boundary (kernels/hc_boundary.py): its CUDA tests, then test_replay_gpu under triton;
#   phase 2, in parallel: GPU 0 moe_bench (T = 1, 4); GPU 1 hc_boundary_bench (rows 1, 4, 16);
#   phase 3, both GPUs: flash decode, one process per arm: base; fused_sum; symm; hcfuse (triton); all three.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s6_call1.sh
source benchmarks/gpu_env.sh
(
  export CUDA_VISIBLE_DEVICES=0 DSV4_FUSED_SPLIT_SUM=1
  timeout 130 python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_qgemv.py \
    > "$OUT/pytest_fused_sum.txt" 2>&1
  echo "pytest rc=$? DSV4_FUSED_SPLIT_SUM=1" >> "$OUT/pytest_fused_sum.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 50 python -m pytest -q -p no:cacheprovider tests/test_hc_boundary.py > "$OUT/pytest_hc_boundary.txt" 2>&1
  echo "pytest rc=$? hc_boundary" >> "$OUT/pytest_hc_boundary.txt"
  DSV4_KERNELS=triton timeout 85 python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py \
    > "$OUT/pytest_replay_triton_hcfuse.txt" 2>&1
  echo "pytest rc=$? DSV4_KERNELS=triton" >> "$OUT/pytest_replay_triton_hcfuse.txt"
) &
wait
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 70 python benchmarks/moe_bench.py --tokens 1,4 > "$OUT/moe_bench.txt" 2>&1
  echo "rc=$?" >> "$OUT/moe_bench.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 70 python benchmarks/hc_boundary_bench.py --rows 1,4,16 > "$OUT/hc_boundary_bench.txt" 2>&1
  echo "rc=$?" >> "$OUT/hc_boundary_bench.txt"
) &
wait
for arm in base: fused_sum:DSV4_FUSED_SPLIT_SUM=1 symm:DSV4_REDUCE=symm hcfuse:DSV4_KERNELS=triton \
    all:DSV4_FUSED_SPLIT_SUM=1,DSV4_REDUCE=symm,DSV4_KERNELS=triton; do
  label=${arm%%:*}; assigns=${arm#*:}
  env ${assigns//,/ } timeout 70 python -m dsv4.cli bench --preset flash --device cuda --ranks 2 --prime 64 \
    --steps 32 --rows 2 > "$OUT/bench_flash_$label.txt" 2>&1
  echo "bench rc=$? $assigns" >> "$OUT/bench_flash_$label.txt"
done
