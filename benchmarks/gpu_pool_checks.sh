#!/usr/bin/env bash
# One device call on 2 x H200 (nvidia-h200-x2), ~9 minutes: the pooled decode path (dsv4.state.StatePool, issue 12),
# whose kernels are not GPU-checked yet (dsv4/kernels/pooled.py), so everything pooled runs under
# DSV4_KERNELS=triton. Outputs under a scratch folder ($RES), returned as $OUT/results.tgz and $OUT/summary.txt.
#   phase 1, in parallel:
#     GPU 0: the CUDA tests: test_pool (pooled alone == plain alone and batched == solo, bit for bit; the pooled
#            kernels == the plain ones per row; no host sync; launches independent of B), and the plain
#            attention / compressor kernels' tests (their source gained the POOLED variant);
#     GPU 1: the gate on mini, 1 rank, pooled states (DSV4_POOL=8), --batch 4: batched graph vs solo graphs;
#   phase 2, both GPUs: the gate on mini, 2 ranks, pooled, --batch 4; then batch_bench on flash, 2 ranks, each
#            size as plain states and as pool slots (BATCH records, pool false / true, vs_plain).
# Usage: OUT=dir [RES=/tmp/res] [SIZES="1 4 8 16 32"] bash benchmarks/gpu_pool_checks.sh
source benchmarks/gpu_env.sh
export DSV4_KERNELS=triton
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python -m pytest -q -p no:cacheprovider tests/test_pool.py tests/test_attention_kernel.py \
    tests/test_compressor_kernel.py > "$OUT/pytest.txt" 2>&1
  echo "pytest rc=$? kernels=triton" >> "$OUT/pytest.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  DSV4_POOL=8 timeout 200 python -m dsv4.cli gate --preset mini --device cuda --prime 128 --output 64 --batch 4 \
    --out "$OUT/gate_mini_pool_1rank.txt" > "$OUT/gate_mini_pool_1rank_stdout.txt" 2>&1
  echo "gate rc=$?" >> "$OUT/gate_mini_pool_1rank_stdout.txt"
) &
wait
DSV4_POOL=8 timeout 150 python -m dsv4.cli gate --preset mini --device cuda --ranks 2 --prime 128 --output 64 \
  --batch 4 --out "$OUT/gate_mini_pool_2ranks.txt" > "$OUT/gate_mini_pool_2ranks_stdout.txt" 2>&1
echo "gate rc=$?" >> "$OUT/gate_mini_pool_2ranks_stdout.txt"
# shellcheck disable=SC2086
timeout "${FLASH_BENCH_TIMEOUT:-240}" python benchmarks/batch_bench.py flash --ranks 2 --pool \
  --sizes ${SIZES:-1 4 8 16 32} > "$OUT/batch_bench_flash_pool.txt" 2>&1
echo "batch_bench rc=$?" >> "$OUT/batch_bench_flash_pool.txt"
