#!/usr/bin/env bash
# One device call on 2 x H200 (nvidia-h200-x2), <= 9 minutes: the checks that let session 5's switched-off
# paths go live. Outputs under $RES, returned as $OUT/results.tgz + $OUT/summary.txt.
#   phase 1, in parallel:
#     GPU 0: CUDA tests: the pooled decode (test_pool, and the attention / compressor kernels whose source gained
#            the pooled variant) and replay identity under DSV4_KERNELS=triton; the fused split sums and MoE
#            variants (test_qgemv, test_dense_kernel), test_syncguard; the prefill attention kernel's tests;
#     GPU 1: qgemv A/B (split sums fused vs a second launch); the prefill attention kernel against the
#            reference at Flash shapes; the HTTP server on mini (its slots now one StatePool; default kernels);
#   phase 2, both GPUs: the gate on mini, 2 ranks, pooled states, --batch 4 (triton); batch_bench on flash,
#            2 ranks, plain vs pooled at $SIZES (triton); flash prefill of 4,096 tokens (triton: prefill attention).
# Usage: OUT=dir [RES=/tmp/res] [SIZES="1 16"] bash benchmarks/gpu_switch_checks.sh
source benchmarks/gpu_env.sh
PATTN_TESTS=$(ls tests/test_prefill_attention.py 2>/dev/null)
(
  export CUDA_VISIBLE_DEVICES=0
  DSV4_KERNELS=triton timeout 110 python -m pytest -q -p no:cacheprovider tests/test_pool.py \
    tests/test_attention_kernel.py tests/test_compressor_kernel.py tests/test_replay_gpu.py > "$OUT/pytest_pool.txt" 2>&1
  echo "pytest rc=$? kernels=triton" >> "$OUT/pytest_pool.txt"
  timeout 100 python -m pytest -q -p no:cacheprovider tests/test_qgemv.py tests/test_dense_kernel.py \
    tests/test_syncguard.py $PATTN_TESTS > "$OUT/pytest_kernels.txt" 2>&1
  echo "pytest rc=$? kernels=auto" >> "$OUT/pytest_kernels.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 60 python benchmarks/qgemv_bench.py --arms '^(v2_default|v2_fused_sum|v2_programs528|v2_fused_sum_programs528)$' \
    > "$OUT/qgemv_ab.txt" 2>&1
  echo "rc=$?" >> "$OUT/qgemv_ab.txt"
  if [ -f benchmarks/prefill_attention_bench.py ]; then
    timeout 70 python benchmarks/prefill_attention_bench.py --configs default,n64,skips > "$OUT/pattn_bench.txt" 2>&1
    echo "rc=$?" >> "$OUT/pattn_bench.txt"
  fi
  timeout 80 python benchmarks/serve_bench.py --preset mini --device cuda --concurrency 1,4,16 \
    --prompt-tokens 64 --max-tokens 32 --level-timeout 30 > "$OUT/serve_mini.txt" 2>&1
  echo "serve_bench rc=$?" >> "$OUT/serve_mini.txt"
) &
wait
DSV4_KERNELS=triton DSV4_POOL=8 timeout 80 python -m dsv4.cli gate --preset mini --device cuda --ranks 2 --prime 128 \
  --output 32 --batch 4 --out "$OUT/gate_mini_pool.txt" > "$OUT/gate_mini_pool_stdout.txt" 2>&1
echo "gate rc=$?" >> "$OUT/gate_mini_pool_stdout.txt"
# shellcheck disable=SC2086
DSV4_KERNELS=triton timeout "${BATCH_TIMEOUT:-140}" python benchmarks/batch_bench.py flash --ranks 2 --pool \
  --sizes ${SIZES:-1 16} --steps 16 --rows 3 > "$OUT/batch_flash_pool.txt" 2>&1
echo "batch_bench rc=$?" >> "$OUT/batch_flash_pool.txt"
DSV4_KERNELS=triton timeout "${PREFILL_TIMEOUT:-90}" python benchmarks/prefill_bench.py flash --sizes 4096 --runs 2 \
  --eager-steps 0 --graph-steps 16 > "$OUT/prefill_flash.txt" 2>&1
echo "prefill rc=$?" >> "$OUT/prefill_flash.txt"
