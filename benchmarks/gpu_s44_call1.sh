#!/usr/bin/env bash
# Session 44, call 1 (one H200): moe_gl CONFIG down_rows (kernel 2 of a solo step as a program a row block and token
# that sums the token's terms itself: no ticket; off by default, never GPU-run) and moe CONFIG shared_lane at a Flash
# rank's shapes (session 43 call 8's A/B was cut before its first row):
#   1. their CUDA tests (down_rows == the ticketed programs bit for bit; kernel 2's early form alongside);
#   2. decode_ab on the Flash rank proxy: defaults, rows, lane;
#   3. the gate on mini with down_rows on (the stream must stay 96066ac1 / 1fd7a9bb: the same bits);
#   4. decode_ab on mini: defaults, rows.
# Usage: OUT=dir bash benchmarks/gpu_s44_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 90 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures tests/test_moe_gl.py \
  -k "down_rows or down_early"
step 260 "$OUT/decode_ab_flash.txt" python benchmarks/decode_ab_bench.py --preset flash --proxy-world 2 --steps 64 \
  --rounds 4 --arm rows=moe_gl.down_rows=1 --arm lane=moe.shared_lane=1
DSV4_MOE_GL_DOWN_ROWS=1 step 90 "$OUT/gate_rows.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 \
  --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-rows.txt"
step 60 "$OUT/decode_ab_mini.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm rows=moe_gl.down_rows=1
