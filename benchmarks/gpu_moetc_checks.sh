#!/usr/bin/env bash
# Issues 10 and 12 (branch moetc) on 2 x H200 (nvidia-h200-x2), <= 6 minutes: the routed experts' FP4 gate/up and
# down on the tensor cores (kernels/moe.py CONFIG tensor_cores, DSV4_MOE_TC=1; off by default).
#   phase 1, in parallel (<= 130 s):
#     GPU 0: the CUDA tests with the variant on: tests/test_moe_tc.py (against the reference, every row of
#            B = 1/3/16 equal to that row alone, fp16 row scaling, remote experts unread) and test_qgemv's MoE tests
#            (DSV4_MOE_TC=1 makes the variant the default there: its bf16 FP4 cases run it);
#     GPU 1: moe_bench --tokens 1,16 on today's kernels (base, split4) and every tensor-core arm: us, fraction of
#            the copy bandwidth, max_rel_err, rows_exact (each arm must be rows_exact and within tolerance);
#   phase 2, both GPUs (<= 230 s): batch_bench flash --ranks 2 --pool --sizes 1 16 with v3 GEMVs, DSV4_MOE_TC=0
#     against 1 (session 7: 28.5 ms a 16-row step, gate/up 11.2 + down 4.8 ms of it; 9.6 ms a solo token).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_moetc_checks.sh
source benchmarks/gpu_env.sh
V3="DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3"
(
  export CUDA_VISIBLE_DEVICES=0 DSV4_KERNELS=triton DSV4_MOE_TC=1
  timeout 125 python -m pytest -q -p no:cacheprovider tests/test_moe_tc.py tests/test_qgemv.py -k "tc or moe" \
    > "$OUT/pytest_moetc.txt" 2>&1
  echo "pytest rc=$? DSV4_KERNELS=triton DSV4_MOE_TC=1" >> "$OUT/pytest_moetc.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 125 python benchmarks/moe_bench.py --tokens 1,16 --arms '^(base|split4|tc.*)$' > "$OUT/moe_bench_tc.txt" 2>&1
  echo "rc=$?" >> "$OUT/moe_bench_tc.txt"
) &
wait
for tc in 0 1; do
  timeout 115 env $V3 DSV4_MOE_TC=$tc python benchmarks/batch_bench.py flash --ranks 2 --pool --sizes 1 16 --steps 16 \
    --rows 2 > "$OUT/batch_flash_pool_v3_moetc$tc.txt" 2>&1
  echo "rc=$? v3 DSV4_MOE_TC=$tc" >> "$OUT/batch_flash_pool_v3_moetc$tc.txt"
done
