#!/usr/bin/env bash
# Session 37, call 4 (one H200), main's tree (2b27ba0's CUDA code): kernel 1's shared programs (the next K step's tiles
# first; shared_early) beyond the solo decode, against earlier sessions' figures of the same benches:
#   1. moe_bench on mini's expert shapes (world 1): kernel 1 with the shared expert and the routed layer at 1, 16 and
#      32 tokens (session 26 call 2, session 27 call 1: kernel 1 with the shared expert 313.2 / 279.3 us at 16);
#   2. the server on mini at concurrency 1 / 4 / 16 (session 35 call 2: 606.9 / 1,301.2 / 2,275.5 tok/s).
# Usage: OUT=dir bash benchmarks/gpu_s37_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
step 150 "$OUT/moe_bench.txt" python benchmarks/moe_bench.py --world 1 --tokens 1,16,32 --arms '^gl(_grouped)?$' \
  --calls 32
step 150 "$OUT/serve_mini.txt" python benchmarks/serve_bench.py --preset mini --device cuda --prompt-tokens 64 \
  --max-tokens 64 --warmup 1 --concurrency 1,4,16
