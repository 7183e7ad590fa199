#!/usr/bin/env bash
# Session 6, call 6 on 2 x H200 (nvidia-h200-x2), <= 8 minutes: prefill's routed experts on the dense path
# (dsv4.kernels.dequant + torch._grouped_mm, prefill_moe CONFIG dense_above 0) and the FP4 kernel's new tiles.
#   phase 1, in parallel: GPU 0 tests/test_prefill.py + tests/test_prefill_limit.py on CUDA (the dequant kernel's
#     CUDA test among them); GPU 1 mini's prefill beside HF transformers' forward (64, 512, 4,096 tokens);
#   phase 2, both GPUs: flash prefill at 4,096 / 32,768 / 131,072 tokens with decode after (graph);
#     the prefill's device time by kernel (prefill_host.py, 4,096 tokens);
#     DSV4_PREFILL_STORE_LIMIT=1 against 0 at 32,768 tokens with --digest (bit-identical, time).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s6_call6.sh
source benchmarks/gpu_env.sh
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 110 python -m pytest -q -p no:cacheprovider tests/test_prefill.py tests/test_prefill_limit.py \
    > "$OUT/pytest_prefill.txt" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_prefill.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 110 python benchmarks/prefill_bench.py mini --sizes 64 512 4096 --runs 3 > "$OUT/prefill_mini.txt" 2>&1
  echo "rc=$?" >> "$OUT/prefill_mini.txt"
) &
wait
timeout 200 python benchmarks/prefill_bench.py flash --sizes 4096 32768 131072 --runs 3 --long-runs 1 \
  --eager-steps 2 --graph-steps 32 --no-hf > "$OUT/prefill_flash.txt" 2>&1
echo "rc=$?" >> "$OUT/prefill_flash.txt"
timeout 60 python benchmarks/prefill_host.py --preset flash --ranks 2 --tokens 4096 --top 25 \
  > "$OUT/prefill_host_4096.txt" 2>&1
echo "rc=$?" >> "$OUT/prefill_host_4096.txt"
for limit in 0 1; do
  DSV4_PREFILL_STORE_LIMIT=$limit timeout 50 python benchmarks/prefill_bench.py flash --sizes 32768 --runs 1 \
    --long-runs 1 --digest --eager-steps 0 --graph-steps 0 --no-hf > "$OUT/prefill_flash_limit$limit.txt" 2>&1
  echo "rc=$? store_limit=$limit" >> "$OUT/prefill_flash_limit$limit.txt"
done
