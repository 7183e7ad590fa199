#!/usr/bin/env bash
# Session 44, call 7 (one H200, the session's last ~290 device seconds): moe_gl CONFIG solo_gate_up_warps (a one-token
# step's kernel 1 at 8 warps a program: one step of loads a warp; off by default, never GPU-run; other bits), decode_ab
# on the Flash rank proxy and on mini. A speed A/B only: its CUDA tests and the gate are next session's if it pays.
# Usage: OUT=dir bash benchmarks/gpu_s44_call7.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=8
step 130 "$OUT/decode_ab_flash.txt" python benchmarks/decode_ab_bench.py --preset flash --proxy-world 2 --steps 64 \
  --rounds 4 --arm w8=moe_gl.solo_gate_up_warps=8
step 55 "$OUT/decode_ab_mini.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm w8=moe_gl.solo_gate_up_warps=8
