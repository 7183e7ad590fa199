#!/usr/bin/env bash
# Session 29, call 1 (one H200; was gpu_next.sh), main's tree (session 28's end: the server's GEMVs mma by default, the GPU
# suite whole passed at c980d0b):
#   1. decode_ab_bench on mini: switches that are off, or tiles never re-measured since PDL (session 18) and the
#      defaults that followed, against the defaults in one process (graph and pipelined, ABBA rounds): decode
#      attention's combine in the split launch (session 9: no gain on flash at one row, before PDL), the mHC
#      boundary's slices of 64 and its 4-warp programs (session 6's sweep, before PDL), the experts' tensor-core
#      programs loading 2 or 8 chunks of 128 inputs before their products (4 by default since session 16; mini's
#      kernels 1 and 2 at one token run at ~0.54 of the copy bandwidth);
#   2. the server on mini at concurrency 1 / 4 / 16 / 32 with its default (a throwaway server first: a fresh
#      machine's first server compiles for 70-130 s, session 28 call 3 lost its levels so).
# The GPU suite whole needs a call of its own (~420 s: `source benchmarks/gpu_env.sh; gpu_suite 440 FILE`).
# Session 28's L2 prefetch (commits 8ca7f30..4474c78, removed: pipelined decode slower at every budget) is the next
# try only with a new idea for its DRAM contention (e.g. a prefetch issued by the GEMV before, not beside a
# latency-bound kernel).
# Usage: OUT=dir bash benchmarks/gpu_s29_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 150 "$OUT/decode_ab_mini.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm fused_combine=attention.fused_combine=1 --arm boundary_d64=hc_boundary.block_d=64 \
  --arm boundary_w4=hc_boundary.num_warps=4 --arm experts_u2=moe_gl.mma_unroll=2 --arm experts_u8=moe_gl.mma_unroll=8
SERVE="python benchmarks/serve_bench.py --preset mini --device cuda --prompt-tokens 64 --max-tokens 64 --warmup 1"
step 150 "$OUT/serve_warm.txt" $SERVE --concurrency 1
step 80 "$OUT/serve_mini.txt" $SERVE --concurrency 1,4,16,32
