#!/usr/bin/env bash
# Session 38, call 2 (one H200): a one-token step's expert kernels capped in registers so that each launch is one
# wave (moe_gl CONFIG solo_gate_up_maxnreg / solo_down_maxnreg, off by default; the same operations, the same bits).
#   1. tests/test_moe_gl.py's register-cap case (kernels 1 and 2 capped and not: the same bits, 1 and 16 tokens);
#   2. decode_ab_bench on mini: the defaults against kernel 2 at 40 registers, kernel 1 at 64 / 72, and both;
#   3. moe_bench at one token, Flash's per-rank shapes (world 2) and mini's (world 1): the same arms, kernel times;
#   4. kernel_table on mini with kernel 2 at 40 and kernel 1 at 64 (each kernel's advance a token).
# Usage: OUT=dir bash benchmarks/gpu_s38_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 120 "$OUT/pytest_cap.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures tests/test_moe_gl.py \
  -k register_cap
step 260 "$OUT/decode_ab.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm down40=moe_gl.solo_down_maxnreg=40 --arm up64=moe_gl.solo_gate_up_maxnreg=64 \
  --arm up72=moe_gl.solo_gate_up_maxnreg=72 --arm both=moe_gl.solo_down_maxnreg=40,moe_gl.solo_gate_up_maxnreg=64
step 100 "$OUT/moe_bench_flash.txt" python benchmarks/moe_bench.py --world 2 --tokens 1 \
  --arms '^gl(_solo72|_solo64|_down40)?$' --calls 32
step 100 "$OUT/moe_bench_mini.txt" python benchmarks/moe_bench.py --world 1 --tokens 1 \
  --arms '^gl(_solo72|_solo64|_down40)?$' --calls 32
step 90 "$OUT/kernel_table_caps.txt" env DSV4_MOE_GL_SOLO_DOWN_MAXNREG=40 DSV4_MOE_GL_SOLO_MAXNREG=64 \
  python benchmarks/kernel_table.py --preset mini --device cuda --steps 16 --sequence --top 40
