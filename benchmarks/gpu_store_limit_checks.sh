#!/usr/bin/env bash
# One device call on 2 x H200 (nvidia-h200-x2), ~7 minutes: DSV4_PREFILL_STORE_LIMIT=1 (prefill chunks score
# only the compressed rows committed before them: the indexer's keys + top-k, HCA's rows in the prefill
# kernel) checked bit-identical and timed on long prompts (issue 11). Outputs under $RES, returned as
# $OUT/results.tgz + $OUT/summary.txt.
#   1. GPU 0: tests/test_prefill_limit.py on CUDA (the indexer's picks and HCA's kernel output over the cut
#      stores equal the whole stores'; tiny fp32 prefill through those kernels, and tiny bf16 with every kernel
#      and the default tiles, logits and state digest equal with the limit and without).
#   2. Both GPUs: flash on 2 ranks, $FLASH_KERNELS (default triton), prefill_bench at $SIZES (default 4,096 and
#      131,072 tokens) with --digest, first without the limit, then with it. Look for: the PREFILL records of
#      each size with store_limit "0" and "1" print the same logits_sha and digests; tok_s of 131,072 tokens
#      (1,186 at c7b6145 without the limit). The limit's first long prefill also compiles the prefill attention
#      kernel for each cut HCA row count (up to 4 more variants at 128k, ~seconds): counted in its time.
# Usage: OUT=dir [RES=/tmp/res] [FLASH_KERNELS=triton] [SIZES="4096 131072"] bash benchmarks/gpu_store_limit_checks.sh
source benchmarks/gpu_env.sh
CUDA_VISIBLE_DEVICES=0 timeout "${TEST_TIMEOUT:-120}" python -m pytest -q -p no:cacheprovider \
  tests/test_prefill_limit.py > "$OUT/pytest_store_limit.txt" 2>&1
echo "pytest rc=$?" >> "$OUT/pytest_store_limit.txt"
K=${FLASH_KERNELS:-triton}
for limit in 0 1; do
  DSV4_KERNELS=$K DSV4_PREFILL_STORE_LIMIT=$limit timeout "${FLASH_TIMEOUT:-220}" \
    python benchmarks/prefill_bench.py flash --sizes ${SIZES:-4096 131072} --runs 1 --long-runs 1 --digest \
    --eager-steps 0 --graph-steps 0 \
    > "$OUT/prefill_flash_limit$limit.txt" 2>&1
  echo "rc=$? kernels=$K store_limit=$limit" >> "$OUT/prefill_flash_limit$limit.txt"
done
grep -h '^PREFILL ' "$OUT"/prefill_flash_limit*.txt > "$OUT/prefill_flash_compare.txt" 2>&1
