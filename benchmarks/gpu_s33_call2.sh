#!/usr/bin/env bash
# Session 33, call 2 (one H200, ~10 min), main's final tree: pair_norms on by default (q's latent norm and kv's norm +
# rope in one launch, the same bits; call 1: +0.45 % pipelined), the deferred Sinkhorn and the split kernel's q norm
# removed (call 1: slower):
#   1. the GPU suite whole (5 workers), failures written as they happen;
#   2. the gate on mini under the defaults (replay, refusals, batch identity; the stream of sessions 30-32 expected:
#      pair_norms changes no bit).
# Usage: OUT=dir bash benchmarks/gpu_s33_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=25
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
gpu_suite 480 "$OUT/pytest_gpu_suite.txt" -p pytest_failures
step 100 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 --prime 64 \
  --output 64 --out "$OUT/receipts-gate-mini.txt"
