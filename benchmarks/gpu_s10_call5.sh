#!/usr/bin/env bash
# Session 10 call 5 (nvidia-h200, one GPU, <= 4.5 min; carry .whl): main's server with return_token_ids through the
# real HTTP server on mini (serve_bench: IDENTITY now by token ids; concurrency 1, 4, 16), then the gate on mini with
# DSV4_PDL=1 (1 rank, --batch 4: replay exact, refusal cells, batched == solo, with the PDL edges in the graph).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s10_call5.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=25
timeout 120 python benchmarks/serve_bench.py --preset mini --device cuda --concurrency 1,4,16 --prompt-tokens 64 \
  --max-tokens 64 > "$OUT/serve_mini.txt" 2>&1; echo "serve_bench rc=$?" >> "$OUT/serve_mini.txt"
DSV4_PDL=1 timeout 120 python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --prime 64 --output 64 --batch 4 \
  --out "$OUT/receipts_gate_mini_pdl.txt" > "$OUT/gate_mini_pdl.txt" 2>&1; echo "gate rc=$?" >> "$OUT/gate_mini_pdl.txt"
