#!/usr/bin/env bash
# Session 13 call 6 (nvidia-h200, one GPU, <= 4.5 min): 512-token prompts through the server in chunks of 128 (short
# chunks, grouped 16 a forward: the tensor cores by default) instead of the default one chunk of 512 a prompt (a
# forward of its own, GEMMs: call 5); the pair kernels (DSV4_MOE_TC=off) beside. Concurrency 1 and 16.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s13_call6.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
for tc in chunks off; do
  step 110 "$OUT/serve_mini_v3_p512_c128_tc$tc.txt" env DSV4_MOE_TC=$tc python benchmarks/serve_bench.py \
    --preset mini --device cuda --gemv v3 --concurrency 1,16 --prompt-tokens 512 --max-tokens 64 --warmup 1 \
    --prefill-chunk 128
done
