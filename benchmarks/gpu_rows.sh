#!/usr/bin/env bash
# Rows per program (issue 12, branch rows) on 2 x H200 (nvidia-h200-x2), <= 9.5 minutes: qgemv v2 and the dense
# GEMV read each weight tile once for up to 8 rows (qgemv CONFIG v2_rows, dense CONFIG rows; DSV4_GEMV_ROWS=1
# is the old one program per row). A row's bits must not move: check them first, then time.
#   1. the CUDA cases of the row-exactness tests (every row of B = 1/3/8/11 == that row alone at 1 row/program)
#      and the tiny models (FP8 and bf16) batched == solo through the kernels;
#   2. qgemv_bench --rows: each FP8 linear of a flash layer at 1/4/16/32 rows, v2_rows 1/8/16 (rows_exact);
#   3. dense_bench: flash's dense products at 1/4/16/32 rows, rows 1 vs the default (8; 2 on the head) vs 16;
#   4. the gate on mini, 2 ranks, --batch 4 (batched == solo bytes, default = multi-row);
#   5. batch_bench flash --pool at 16 rows with the kernel table, DSV4_GEMV_ROWS=1 then the default.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_rows.sh
source benchmarks/gpu_env.sh
DSV4_SLOW=1 timeout 120 python -m pytest -q -x tests/test_qgemv.py tests/test_dense_kernel.py \
  -k "(cuda and (v2_rows or rows_equal or fused_sum_bit or v2_linear)) or quantised_tiny or tiny_batched" \
  > "$OUT/tests_rows_cuda.txt" 2>&1
echo "pytest rc=$?" >> "$OUT/tests_rows_cuda.txt"
timeout 120 python benchmarks/qgemv_bench.py --rows 1,4,16,32 > "$OUT/qgemv_rows.txt" 2>&1
echo "rc=$?" >> "$OUT/qgemv_rows.txt"
timeout 100 python benchmarks/dense_bench.py --rows 1,4,16,32 \
  --arms '^(cublas_per_row|kernel_default|kernel_rows1|kernel_rows16|kernel_rows16_acc256)$' > "$OUT/dense_rows.txt" 2>&1
echo "rc=$?" >> "$OUT/dense_rows.txt"
timeout 90 python -m dsv4.cli gate --preset mini --device cuda --ranks 2 --prime 128 --output 128 --batch 4 \
  --out "$OUT/gate_mini_128_batch4_rows.txt" > "$OUT/gate_mini_stdout.txt" 2>&1
echo "gate rc=$?" >> "$OUT/gate_mini_stdout.txt"
for rows in 1 8; do
  DSV4_GEMV_ROWS=$rows timeout 75 python benchmarks/batch_bench.py flash --ranks 2 --pool \
    --sizes 16 --steps 16 --rows 2 --profile 16 --profile-steps 4 --top 30 > "$OUT/batch_flash_pool16_rows$rows.txt" 2>&1
  echo "rc=$?" >> "$OUT/batch_flash_pool16_rows$rows.txt"
done
