#!/usr/bin/env bash
# Session 15 call 3 (nvidia-h200, one GPU, <= 9 min): what call 2's 120 s cut (prefill attention's and moe_tc's
# CUDA tests), mini's kernels per token with the GEMV's tiles by shape off then on (device time: call 2's graph
# rows varied +-5 %, more than the change), and the gate on mini (--batch 4) under main's new defaults.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s15_call3.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
step 150 "$OUT/pytest_prefill_tc.txt" python -m pytest -q -p no:cacheprovider tests/test_prefill_attention.py \
  tests/test_moe_tc.py
for tiles in 0 1; do
  DSV4_QGEMV_SHAPE_TILES=$tiles step 60 "$OUT/kernel_table_mini_tiles$tiles.txt" python benchmarks/kernel_table.py \
    --preset mini --steps 16
done
step 110 "$OUT/gate_mini_64.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 \
  --prime 64 --output 64 --out "$OUT/receipts_gate_mini_64.txt"
# the server warms its prefill kernels before it listens (Scheduler.warm_prefill): no untimed round first here, so
# the first requests' time to first token shows what a cold server's users wait; compiles after start logged
DSV4_LOG_COMPILES=1 step 90 "$OUT/serve_mini_v3_cold.txt" python benchmarks/serve_bench.py --preset mini \
  --device cuda --gemv v3 --concurrency 1,4,16,32 --prompt-tokens 64 --max-tokens 64
