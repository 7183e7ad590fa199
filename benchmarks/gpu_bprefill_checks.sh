#!/usr/bin/env bash
# Issue 12 (branch bprefill) on 2 x H200 (nvidia-h200-x2), <= 8 minutes: several prompts' short prefill chunks in
# one forward (Model.prefill_batch), each bit-identical to its chunk alone; the server groups them.
#   phase 1, in parallel (CUDA tests, DSV4_KERNELS=triton: tiny dense and FP8/FP4, plain and pooled states):
#     GPU 0: tests/test_prefill_batch.py and test_prefill.py -k "short_chunk or host_sync" (the v2 GEMVs);
#     GPU 1: tests/test_prefill_batch.py with DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 (the tensor-core GEMVs' rows alone);
#   phase 2, both GPUs: flash, 16 states x 63 tokens, one prefill each against one prefill_batch (equal: every rank's
#     digest and the logits; speedup), with the v2 and then the v3 GEMVs; the HTTP server on flash at concurrency 1
#     and 16 (64-token prompts; before: aggregate 71.4 / 162.6 tok/s, x2.3; mean TTFT 0.24 / 3.40 s at f75b094).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_bprefill_checks.sh   (carry .whl for serve_bench)
source benchmarks/gpu_env.sh
(
  export CUDA_VISIBLE_DEVICES=0 DSV4_KERNELS=triton
  timeout 120 python -m pytest -q -p no:cacheprovider tests/test_prefill_batch.py tests/test_prefill.py \
    -k "prefill_batch or short_chunk or host_sync" > "$OUT/pytest_prefill_batch_v2.txt" 2>&1
  echo "pytest rc=$? DSV4_KERNELS=triton (v2 GEMVs)" >> "$OUT/pytest_prefill_batch_v2.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1 DSV4_KERNELS=triton DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3
  timeout 120 python -m pytest -q -p no:cacheprovider tests/test_prefill_batch.py \
    > "$OUT/pytest_prefill_batch_v3.txt" 2>&1
  echo "pytest rc=$? DSV4_KERNELS=triton DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3" >> "$OUT/pytest_prefill_batch_v3.txt"
) &
wait
timeout 100 python benchmarks/prefill_batch_bench.py flash --ranks 2 --states 16 --tokens 63 --runs 2 \
  > "$OUT/prefill_batch_flash_v2.txt" 2>&1
echo "rc=$? (v2 GEMVs)" >> "$OUT/prefill_batch_flash_v2.txt"
DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 timeout 100 python benchmarks/prefill_batch_bench.py flash --ranks 2 --states 16 \
  --tokens 63 --runs 2 > "$OUT/prefill_batch_flash_v3.txt" 2>&1
echo "rc=$? DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3" >> "$OUT/prefill_batch_flash_v3.txt"
timeout 110 python benchmarks/serve_bench.py --preset flash --device cuda --ranks 2 --concurrency 1,16 \
  --prompt-tokens 64 --max-tokens 64 --level-timeout 20 > "$OUT/serve_flash.txt" 2>&1
echo "serve_bench rc=$?" >> "$OUT/serve_flash.txt"
