#!/usr/bin/env bash
# Session 25 call 2 (one H200, <= 9.5 min): the shared expert's prefill tiles and moe_tc's wave tiles on by default
# (call 1, in one process: a concurrency-16 server's 16 x 63 wave on mini 88.4 -> 58.1 ms; the shared tiles change a
# short chunk's bits, each row's still its own), the server's warm-up waving each wave tile shape; qgemv v3's unrolled
# loop removed. The gate on mini (a new stream: its 64-token prime takes the shared tiles), the GPU suite whole, then
# the server at concurrency 1 and 16.
# Usage: OUT=dir bash benchmarks/gpu_s25_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
step 95 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 --prime 64 \
  --output 64 --out "$OUT/receipts-gate-mini.txt"
gpu_suite 390 "$OUT/pytest_gpu_suite.txt" --durations=5
step 75 "$OUT/serve_mini.txt" python benchmarks/serve_bench.py --preset mini --device cuda --concurrency 1,16 \
  --prompt-tokens 64 --max-tokens 64 --warmup 1
