#!/usr/bin/env bash
# Session 15 call 4 (nvidia-h200, one GPU, <= 7 min): prefill attention's ROW_TILES only where it is read (HCA) and
# the server's warm-up with a wave of every slot: their CUDA tests, the cold server's compiles after start; mini's
# kernels per token with the GEMV's tiles by shape off then on, in one call (call 3's first arm ran out of time).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s15_call4.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
step 120 "$OUT/pytest_prefill.txt" python -m pytest -q -p no:cacheprovider tests/test_prefill_attention.py \
  tests/test_prefill_batch.py
DSV4_LOG_COMPILES=1 step 100 "$OUT/serve_mini_v3_cold.txt" python benchmarks/serve_bench.py --preset mini \
  --device cuda --gemv v3 --concurrency 1,4,16,32 --prompt-tokens 64 --max-tokens 64
for tiles in 0 1; do
  DSV4_QGEMV_SHAPE_TILES=$tiles step 100 "$OUT/kernel_table_mini_tiles$tiles.txt" python benchmarks/kernel_table.py \
    --preset mini --steps 16
done
