#!/usr/bin/env bash
# Session 35, call 2 (the warm machine of call 1, the same tree): the gate on mini with the three early switches on
# (replay correctness, refusal cells, batch identity: the stream against sessions 30-34's 6dd64d77), the kernel
# table under them, and the server on mini with them on and off (TTFT: session 34's unexplained doubling).
# Usage: OUT=dir bash benchmarks/gpu_s35_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=25
EARLY="DSV4_MOE_DOWN_EARLY=1 DSV4_ATTN_EARLY=1 DSV4_POOL_EARLY=1"
step 110 "$OUT/gate_mini_early.txt" env $EARLY python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 \
  --prime 64 --output 64 --out "$OUT/receipts-gate-mini-early.txt"
step 90 "$OUT/kernel_table_early.txt" env $EARLY python benchmarks/kernel_table.py --preset mini --device cuda \
  --steps 16 --sequence --top 40
step 150 "$OUT/serve_early.txt" env $EARLY python benchmarks/serve_bench.py --preset mini --device cuda \
  --prompt-tokens 64 --max-tokens 64 --warmup 1 --concurrency 1,4,16
step 150 "$OUT/serve_plain.txt" python benchmarks/serve_bench.py --preset mini --device cuda --prompt-tokens 64 \
  --max-tokens 64 --warmup 1 --concurrency 1,4,16
