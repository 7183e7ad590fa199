#!/usr/bin/env bash
# Session 37, call 1 (one H200): kernel 1's shared programs at one token (moe_gl CONFIG shared_depth, shared_early,
# shared_rows_per_thread_solo; off by default):
#   1. tests/test_moe_gl.py's shared cases: each switch keeps kernel 1's bits (routed and shared rows, 1/3/16 tokens);
#   2. decode_ab_bench on mini: the defaults (the loop as it was) against shared_depth 1 (the sums in _fp8_sums: 78
#      registers for 96), 2 (the next step's tiles first), each with and without shared_early, graph and pipelined,
#      ABBA; each arm says whether it sampled the defaults' stream (the same bits: it must);
#   3. the kernel table of mini's graph with shared_depth 2 + shared_early (kernel 1's microseconds a token).
# Usage: OUT=dir bash benchmarks/gpu_s37_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=25
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 150 "$OUT/pytest_shared.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures \
  tests/test_moe_gl.py -k "switches or shared_expert_in"
step 230 "$OUT/decode_ab.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm d1=moe_gl.shared_depth=1 --arm d2=moe_gl.shared_depth=2 \
  --arm d1e=moe_gl.shared_depth=1,moe_gl.shared_early=1 --arm d2e=moe_gl.shared_depth=2,moe_gl.shared_early=1
step 90 "$OUT/kernel_table_d2e.txt" env DSV4_MOE_GL_SHARED_DEPTH=2 DSV4_MOE_GL_SHARED_EARLY=1 \
  python benchmarks/kernel_table.py --preset mini --device cuda --steps 16 --sequence --top 40
