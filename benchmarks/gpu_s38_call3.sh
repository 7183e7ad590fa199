#!/usr/bin/env bash
# Session 38, call 3 (one H200): main with kernel 2 of a one-token step capped at 40 registers by default (call 2's
# arm), and hc_boundary CONFIG scalar_sinkhorn (off by default: Sinkhorn on 16 scalars, no shuffle).
#   1. the gate on mini (the stream of sessions 30-37 expected: the cap changes no bit);
#   2. tests/test_moe_gl.py and tests/test_hc_boundary.py on the GPU (the scalar option among the finish's options);
#   3. hc_boundary_bench at one row: the default finish against the scalar Sinkhorn (us a call, the bits);
#   4. decode_ab_bench on mini: the defaults against kernel 2 uncapped, and against the scalar Sinkhorn.
# Usage: OUT=dir bash benchmarks/gpu_s38_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" DURATIONS_FILE="$OUT/durations.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 120 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 --prime 64 \
  --output 64 --out "$OUT/receipts-gate-mini.txt"
step 200 "$OUT/pytest_gl_boundary.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures -n 2 \
  tests/test_moe_gl.py tests/test_hc_boundary.py
step 100 "$OUT/hc_boundary_bench.txt" python benchmarks/hc_boundary_bench.py --rows 1 --arms 'fused_(default|scalar)$'
step 200 "$OUT/decode_ab.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm uncapped=moe_gl.solo_down_maxnreg=0 --arm scalar=hc_boundary.scalar_sinkhorn=1
