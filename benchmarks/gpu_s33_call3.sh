#!/usr/bin/env bash
# Session 33, call 3 (one H200, ~3 min), main's final tree: moe_gl's solo_maxnreg (off by default; call 2's suite held
# its bits to the uncapped build's): a one-token step's kernel 1 capped at 80 and at 64 registers (6 and 8 blocks an SM
# where 96 let 5) against the defaults, graph and pipelined, one process (ABBA).
# Usage: OUT=dir bash benchmarks/gpu_s33_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=25
step 170 "$OUT/decode_ab_solo_cap.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm cap80=moe_gl.solo_maxnreg=80 --arm cap64=moe_gl.solo_maxnreg=64
