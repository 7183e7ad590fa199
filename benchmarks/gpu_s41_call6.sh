#!/usr/bin/env bash
# Session 41, call 6 (call 5's tree, main's defaults): the server on mini at concurrency 1 / 4 / 16 (the batched
# graphs: batch_lean on; the pool's rows keep the torch settle), and the solo step's host gap.
# Usage: OUT=dir bash benchmarks/gpu_s41_call6.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
step 150 "$OUT/serve_mini.txt" python benchmarks/serve_bench.py --preset mini --device cuda --prompt-tokens 64 \
  --max-tokens 64 --warmup 1 --concurrency 1,4,16
step 90 "$OUT/step_host_gap.txt" python benchmarks/step_host_gap.py --preset mini --steps 64 --rounds 4
