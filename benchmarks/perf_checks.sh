#!/usr/bin/env bash
# One device call on 2 x H200 (nvidia-h200-x2), ~4 minutes (at most 6 by its timeouts): the checks of the
# one-launch commit (kernels/commit_step.py) and attention's norm + rope (kernels/normrope.py), and where a
# token's time goes (benchmarks/kernel_table.py). Results under $OUT, six files at most:
#   phase 1, in parallel:
#     GPU 0: pytest.txt           the new kernels' tests on CUDA and the replay identity on mini (256 sampled
#                                 steps, graph bit-identical to eager, the eager step never syncs) under
#                                 DSV4_KERNELS=triton, so the graph holds the one-launch commit and norm + rope;
#                                 then test_kernels.py's commit and refusal tests;
#     GPU 1: table_mini_triton.txt, table_mini_auto.txt   mini's kernel table: every kernel, then the default ones;
#   phase 2, both GPUs:
#     table_flash_<k>.txt         flash on 2 ranks, for each k in $FLASH_KERNELS (default "triton"; "auto triton"
#                                 adds the default kernels' table, ~2.5 min more).
# Usage: OUT=dir [FLASH_KERNELS="auto triton"] [STEPS=16] bash benchmarks/perf_checks.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:?}
STEPS=${STEPS:-16}
{ python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; nvidia-smi -L;
  git log --oneline -1 2>/dev/null; } > "$OUT/versions.txt" 2>&1
(
  export CUDA_VISIBLE_DEVICES=0
  DSV4_KERNELS=triton timeout 150 python -m pytest -q -p no:cacheprovider tests/test_commit_step.py \
    tests/test_normrope.py tests/test_replay_gpu.py > "$OUT/pytest.txt" 2>&1
  echo "pytest rc=$? kernels=triton" >> "$OUT/pytest.txt"
  # the per-write commit kernel, the refused step and the modules' GPU_CHECKED (each test sets its own policy)
  timeout 40 python -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "commit or refused or declares" \
    >> "$OUT/pytest.txt" 2>&1
  echo "pytest rc=$? kernels=default" >> "$OUT/pytest.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  for k in triton auto; do  # triton first: it compiles the kernels both use
    limit=$([ $k = triton ] && echo 90 || echo 60)
    DSV4_KERNELS=$k timeout $limit python benchmarks/kernel_table.py --preset mini --device cuda --steps "$STEPS" \
      > "$OUT/table_mini_$k.txt" 2>&1
    echo "kernel_table rc=$? kernels=$k" >> "$OUT/table_mini_$k.txt"
  done
) &
wait
for k in ${FLASH_KERNELS:-triton}; do
  DSV4_KERNELS=$k timeout 170 python benchmarks/kernel_table.py --preset flash --device cuda --ranks 2 \
    --steps "$STEPS" > "$OUT/table_flash_$k.txt" 2>&1
  echo "kernel_table rc=$? kernels=$k" >> "$OUT/table_flash_$k.txt"
done
