#!/usr/bin/env bash
# The server on mini under session 34's changes off and on (one H200, ~6 min): session 34 call 3 measured concurrency
# 1 / 4 / 16 / 32 at 621.9 / 1,325.1 / 2,266.5 / 2,506.7 tok/s with TTFT p50 about twice session 33's, TPOT the same.
# Each arm is its own server process (serve_bench.py starts one; the switches are read at import), in the order
# on, off, on, off, so that a machine's drift shows; each with a throwaway concurrency-1 warm-up (--warmup 1).
#   off: DSV4_BATCH_ENDS=0 DSV4_POOL_PAIR=0 DSV4_POOL_ONE_PASS=0 DSV4_POOL_TICKET_NORM=0 DSV4_XPROJ_FIRST=0
# Usage: OUT=dir bash benchmarks/gpu_serve_ab.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
OFF="DSV4_BATCH_ENDS=0 DSV4_POOL_PAIR=0 DSV4_POOL_ONE_PASS=0 DSV4_POOL_TICKET_NORM=0 DSV4_XPROJ_FIRST=0"
for i in 1 2; do
  step 170 "$OUT/serve_on_$i.txt" python benchmarks/serve_bench.py --preset mini --device cuda --prompt-tokens 64 \
    --max-tokens 64 --warmup 1
  step 170 "$OUT/serve_off_$i.txt" env $OFF python benchmarks/serve_bench.py --preset mini --device cuda \
    --prompt-tokens 64 --max-tokens 64 --warmup 1
done
