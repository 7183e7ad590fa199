#!/usr/bin/env bash
# Session 24 call 3 (one H200): DSV4_GEOMETRY_CHUNKS on by default (calls 1-2: its GPU test, the wave's and mini's
# prefill digests unchanged, the wave 98.6 -> 86.8 ms, the server's concurrency-16 TTFT p50 164 -> 117 ms): the gate
# on mini (its 64-token prime takes the chunk kernels), then the GPU suite whole.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s24_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
step 100 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 --prime 64 \
  --output 64 --out "$OUT/receipts-gate-mini.txt"
gpu_suite 450 "$OUT/pytest_gpu_suite.txt" --durations=10
