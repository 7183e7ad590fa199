#!/usr/bin/env bash
# Session 7, call 5 (nvidia-h200-x2, <= 3 min): main 00b8779 (grouped short prefill landed); the HTTP server on flash
# under the default kernels (v2 GEMVs) at concurrency 1, 4, 16, 32.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s7_call5.sh   (carry .whl)
source benchmarks/gpu_env.sh
timeout 170 python benchmarks/serve_bench.py --preset flash --device cuda --ranks 2 --concurrency 1,4,16,32 \
  --prompt-tokens 64 --max-tokens 64 --level-timeout 20 > "$OUT/serve_flash_default.txt" 2>&1
echo "serve_bench rc=$? defaults" >> "$OUT/serve_flash_default.txt"
