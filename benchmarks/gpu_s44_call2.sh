#!/usr/bin/env bash
# Session 44, call 2 (one H200): moe_gl CONFIG solo_gate_up_unroll (a one-token step's kernel 1: the 128-input chunks
# a warp loads before their products, 4 by default; off, never GPU-run) and the shared expert's rows a thread:
#   1. the CUDA test (U 2 and 8 == the default bit for bit, routed rows alone and beside the shared expert's);
#   2. moe_bench at one token, a Flash rank (world 2) and world 1: kernel 1 routed alone and with the shared rows;
#   3. decode_ab on the Flash rank proxy: defaults, u8, u2, srn2 (shared_rows_per_thread 2);
#   4. decode_ab on mini: defaults, u8.
# Usage: OUT=dir bash benchmarks/gpu_s44_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 90 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures tests/test_moe_gl.py \
  -k "solo_unroll"
for w in 2 1; do
  step 90 "$OUT/moe_bench_w$w.txt" python benchmarks/moe_bench.py --world $w --tokens 1 --calls 32 \
    --arms '^gl$|^gl_solo_u[28]$|^gl_srn2$'
done
step 200 "$OUT/decode_ab_flash.txt" python benchmarks/decode_ab_bench.py --preset flash --proxy-world 2 --steps 64 \
  --rounds 4 --arm u8=moe_gl.solo_gate_up_unroll=8 --arm u2=moe_gl.solo_gate_up_unroll=2 \
  --arm srn2=moe_gl.shared_rows_per_thread=2
step 60 "$OUT/decode_ab_mini.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm u8=moe_gl.solo_gate_up_unroll=8
