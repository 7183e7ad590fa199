#!/usr/bin/env bash
# One device call on 2 x H200 (nvidia-h200-x2), ~9.5 minutes: prefill's new kernel checked and prefill timed
# (issue 11). Outputs under $RES, returned as $OUT/results.tgz + $OUT/summary.txt.
#   phase 1, in parallel:
#     GPU 0: tests/test_prefill.py under DSV4_KERNELS=triton (prefill_moe compiled, against the references);
#            the prefill table of mini at 64 and 4,096 tokens, default kernels then triton;
#     GPU 1: mini's prefill beside HF transformers' forward (64, 512, 4,096 tokens), triton;
#   phase 2, both GPUs: flash on 2 ranks, $FLASH_KERNELS (default triton): prefill_bench at 4,096, 32,768 and
#            131,072 tokens with decode (eager and graph) after the largest, and the memory table; then the
#            prefill table at 4,096 tokens.
# Usage: OUT=dir [RES=/tmp/res] [FLASH_KERNELS=triton] bash benchmarks/gpu_prefill_checks.sh
source benchmarks/gpu_env.sh
(
  export CUDA_VISIBLE_DEVICES=0
  DSV4_KERNELS=triton timeout 120 python -m pytest -q -p no:cacheprovider tests/test_prefill.py > "$OUT/pytest_prefill.txt" 2>&1
  echo "pytest rc=$? kernels=triton" >> "$OUT/pytest_prefill.txt"
  for k in auto triton; do
    DSV4_KERNELS=$k timeout 90 python benchmarks/prefill_table.py --preset mini --tokens 64 4096 --top 15 \
      > "$OUT/ptab_mini_$k.txt" 2>&1
    echo "rc=$? kernels=$k" >> "$OUT/ptab_mini_$k.txt"
  done
) &
(
  export CUDA_VISIBLE_DEVICES=1
  DSV4_KERNELS=triton timeout 200 python benchmarks/prefill_bench.py mini --sizes 64 512 4096 --runs 3 \
    > "$OUT/prefill_mini.txt" 2>&1
  echo "rc=$? kernels=triton" >> "$OUT/prefill_mini.txt"
) &
wait
K=${FLASH_KERNELS:-triton}
DSV4_KERNELS=$K timeout "${FLASH_TIMEOUT:-270}" python benchmarks/prefill_bench.py flash --sizes 4096 32768 131072 \
  --runs 2 --long-runs 1 --eager-steps 8 --graph-steps 32 > "$OUT/prefill_flash.txt" 2>&1
echo "rc=$? kernels=$K" >> "$OUT/prefill_flash.txt"
DSV4_KERNELS=$K timeout "${TABLE_TIMEOUT:-120}" python benchmarks/prefill_table.py --preset flash --ranks 2 --tokens 4096 \
  --runs 1 --top 25 > "$OUT/ptab_flash.txt" 2>&1
echo "rc=$? kernels=$K" >> "$OUT/ptab_flash.txt"
