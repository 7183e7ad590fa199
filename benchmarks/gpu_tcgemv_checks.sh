#!/usr/bin/env bash
# Tensor-core decode GEMV (issue 12: qgemv v3, dense v3; off by default) on 2 x H200 (nvidia-h200-x2), two calls:
#   part 1 (<= 6 min), in parallel:
#     GPU 0: tests/test_qgemv.py and tests/test_dense_kernel.py on CUDA (v3: every row of B = 1, 3, 16, 19 equals
#            that row alone bit for bit; against the reference; and v2's tests unchanged);
#     GPU 1: qgemv_bench --rows 1,4,16,32 (v2 one row / 8 rows per program against v3's tiles; rows_exact), then
#            dense_bench --rows 1,4,16,32 (today's kernel against v3 and cuBLAS per row).
#   part 2 (<= 8 min), both GPUs: the gate on mini, 2 ranks, --batch 4 with v3 on (batched == solo bytes through
#     the model, eager and graph); batch_bench flash --pool at 1 and 16 rows, default kernels, then v3 on
#     (DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3), each with the kernel table of the 16-row step.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_tcgemv_checks.sh 1|2
source benchmarks/gpu_env.sh
V3="DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3"
case "${1:?part 1 or 2}" in
1)
  (
    export CUDA_VISIBLE_DEVICES=0
    timeout 200 python -m pytest -q -p no:cacheprovider tests/test_qgemv.py tests/test_dense_kernel.py \
      > "$OUT/pytest_gemv.txt" 2>&1
    echo "pytest rc=$?" >> "$OUT/pytest_gemv.txt"
  ) &
  (
    export CUDA_VISIBLE_DEVICES=1
    timeout 180 python benchmarks/qgemv_bench.py --rows 1,4,16,32 \
      --arms '^(v2_rows1|v2_rows8|v3_default|v3_n16|v3_n64_k128|v3_programs528|v3_nosplit)$' \
      > "$OUT/qgemv_rows.txt" 2>&1
    echo "rc=$?" >> "$OUT/qgemv_rows.txt"
    timeout 150 python benchmarks/dense_bench.py --rows 1,4,16,32 \
      --arms '^(cublas|cublas_per_row|kernel_default|kernel_v3|kernel_v3_n16_k512|kernel_v3_n64_k128|kernel_v3_programs528)$' \
      > "$OUT/dense_rows.txt" 2>&1
    echo "rc=$?" >> "$OUT/dense_rows.txt"
  ) &
  wait
  ;;
2)
  export DSV4_KERNELS=triton
  timeout 120 env $V3 python -m dsv4.cli gate --preset mini --device cuda --ranks 2 --prime 128 --output 128 \
    --batch 4 --out "$OUT/gate_mini_128_batch4_v3.txt" > "$OUT/gate_mini_stdout.txt" 2>&1
  echo "gate rc=$?" >> "$OUT/gate_mini_stdout.txt"
  timeout 150 python benchmarks/batch_bench.py flash --ranks 2 --pool --sizes 1 16 --steps 16 --rows 2 \
    --profile 16 --top 15 > "$OUT/batch_flash_pool_v2.txt" 2>&1
  echo "rc=$?" >> "$OUT/batch_flash_pool_v2.txt"
  timeout 150 env $V3 python benchmarks/batch_bench.py flash --ranks 2 --pool --sizes 1 16 --steps 16 --rows 2 \
    --profile 16 --top 15 > "$OUT/batch_flash_pool_v3.txt" 2>&1
  echo "rc=$?" >> "$OUT/batch_flash_pool_v3.txt"
  ;;
esac
