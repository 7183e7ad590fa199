#!/usr/bin/env bash
# Session 37, calls 6 and 7 (one H200; call 6 ran _s2 too, and its bench took gl_s8 for no shared op), main's tree:
# kernel 1's shared programs' tokens (moe_gl CONFIG shared_tokens, 4 by default since session 27, when 8 took 131
# registers) now that a shared program takes fewer (8: 128, 4: 96, 2: 86 at
# 16 tokens grouped): moe_bench on mini's shapes at 16 and 32 tokens, each arm's bits the default's.
# Usage: OUT=dir bash benchmarks/gpu_s37_call6.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 200 "$OUT/moe_bench_tokens.txt" python benchmarks/moe_bench.py --world 1 --tokens 16,32 \
  --arms '^gl(_s8)?$' --calls 32
