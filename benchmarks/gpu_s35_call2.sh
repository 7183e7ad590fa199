#!/usr/bin/env bash
# Session 35, call 2 (the warm machine of call 1, the same tree): the gate on mini with the compressor's early pools
# (the one switch call 1 measured above its spread: replay correctness, refusal cells, batch identity; the stream
# against sessions 30-34's 6dd64d77), the kernel table under it, and the server on mini with session 34's switches
# on (the defaults) and off (TTFT: session 34's unexplained doubling).
# Usage: OUT=dir bash benchmarks/gpu_s35_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=25
OFF34="DSV4_BATCH_ENDS=0 DSV4_POOL_PAIR=0 DSV4_POOL_ONE_PASS=0 DSV4_XPROJ_FIRST=0"
step 110 "$OUT/gate_mini_pool_early.txt" env DSV4_POOL_EARLY=1 python -m dsv4.cli gate --preset mini --device cuda \
  --ranks 1 --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini-pool-early.txt"
step 90 "$OUT/kernel_table_pool_early.txt" env DSV4_POOL_EARLY=1 python benchmarks/kernel_table.py --preset mini \
  --device cuda --steps 16 --sequence --top 40
step 130 "$OUT/serve_defaults.txt" python benchmarks/serve_bench.py --preset mini --device cuda --prompt-tokens 64 \
  --max-tokens 64 --warmup 1 --concurrency 1,4,16
step 130 "$OUT/serve_off34.txt" env $OFF34 python benchmarks/serve_bench.py --preset mini --device cuda \
  --prompt-tokens 64 --max-tokens 64 --warmup 1 --concurrency 1,4,16
