#!/usr/bin/env bash
# Session 6, call 2 on 2 x H200 (nvidia-h200-x2), <= 9.5 minutes, the new defaults (fused split sums, the fused
# mHC boundary, the shared expert's split-K) and where the time goes now. Outputs under $RES, returned as
# $OUT/results.tgz + $OUT/summary.txt.
#   1. the gate on mini, 2 ranks, at the seed's sizes with --batch 4 (default kernels);
#   2. flash decode, 2 ranks, with --profile (phase breakdown, bytes, roofline);
#   3. the prefill table of a 4,096-token flash prompt (phases, the Triton kernels attributed: measure-ranges);
#   4. batch_bench flash --pool at 16 rows with the kernel table of the pooled step;
#   5. the HTTP server on flash, 2 ranks, concurrency 1, 4, 16 (carry .whl).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s6_call2.sh
source benchmarks/gpu_env.sh
timeout 130 python -m dsv4.cli gate --preset mini --device cuda --ranks 2 --prime 256 --output 256 --batch 4 \
  --out "$OUT/gate_mini_256_batch4.txt" > "$OUT/gate_mini_stdout.txt" 2>&1
echo "gate rc=$?" >> "$OUT/gate_mini_stdout.txt"
timeout 80 python -m dsv4.cli bench --preset flash --device cuda --ranks 2 --prime 64 --steps 32 --rows 3 \
  --profile > "$OUT/bench_flash_profile.txt" 2>&1
echo "bench rc=$?" >> "$OUT/bench_flash_profile.txt"
timeout 90 python benchmarks/prefill_table.py --preset flash --ranks 2 --tokens 4096 --runs 1 --top 40 \
  > "$OUT/ptab_flash_4096.txt" 2>&1
echo "rc=$?" >> "$OUT/ptab_flash_4096.txt"
timeout 100 python benchmarks/batch_bench.py flash --ranks 2 --pool --sizes 16 --steps 16 --rows 2 --profile 16 \
  --profile-steps 4 --top 40 > "$OUT/batch_flash_pool16_profile.txt" 2>&1
echo "rc=$?" >> "$OUT/batch_flash_pool16_profile.txt"
timeout 150 python benchmarks/serve_bench.py --preset flash --device cuda --ranks 2 --concurrency 1,4,16 \
  --prompt-tokens 64 --max-tokens 48 --level-timeout 30 > "$OUT/serve_flash.txt" 2>&1
echo "serve_bench rc=$?" >> "$OUT/serve_flash.txt"
