#!/usr/bin/env bash
# Session 24 call 2 (one H200): DSV4_GEOMETRY_CHUNKS on by default (call 1: its GPU test passed, the 16 x 63 wave's
# digest unchanged, 98.6 -> 86.8 ms) with the chunk kernels' block sizes from the chunk's power of two alone: the
# wave with the shared expert's tiles on (is the wave now bound by its kernels?), the gate on mini, the GPU suite.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s24_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
step 40 "$OUT/wave_shared1.txt" env DSV4_MOE_SHARED_PREFILL_TILES=1 python benchmarks/prefill_batch_bench.py mini \
  --states 16 --tokens 63 --runs 3
step 100 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 --prime 64 \
  --output 64 --out "$OUT/receipts-gate-mini.txt"
gpu_suite 430 "$OUT/pytest_gpu_suite.txt" --durations=10
