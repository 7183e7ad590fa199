#!/usr/bin/env bash
# The next call on nvidia-h200-x2 (<= 10 min), main's tree. Only one H200 was lent from session 10's call 3 to session
# 29, so what came since (PDL on every kernel, moe_gl's tensor-core and grouped programs, the pipelined decode, the
# pool, the server's mma GEMVs, the step kernels) has run on one GPU only: this call is the first of it on two ranks.
# In order of what matters, each step cut at its limit so that the next still runs:
#   1. flash decode, 2 ranks, the defaults (`dsv4 bench`: graph, pipelined and eager arms, 3 rows of 64, --profile's
#      phases, the kernel nodes a token): issue 10's targets 1 (>= 250 tok/s) and 2 (<= 1,200 nodes);
#   2. the two-rank pipelined decode against the plain step (tests/test_generation_gpu.py -k two_ranks);
#   3. the server on flash with its defaults (GEMVs mma) at concurrency 1, 4, 16, 32 with the identity check, its
#      compiles logged (a request waiting on one names it): issue 12's targets (c1 within 10 % of 1.'s solo decode,
#      c16 >= 8 x c1).
# Then, in a call of its own: benchmarks/gpu_flash_gate.sh (the gate on flash at 256/256: issue 10's target 4), and
# benchmarks/gpu_x2_prefill.sh.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_x2_next.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 170 "$OUT/bench_flash.txt" python -m dsv4.cli bench --preset flash --device cuda --ranks 2 --prime 64 \
  --steps 64 --rows 3 --profile
step 100 "$OUT/pytest_generation_two_ranks.txt" python -m pytest -q -p no:cacheprovider -rfE \
  tests/test_generation_gpu.py -k two_ranks
left=$((560 - SECONDS))  # the server with what is left
[ $left -gt 90 ] && step $left "$OUT/serve_flash.txt" env DSV4_LOG_COMPILES=1 python benchmarks/serve_bench.py \
  --preset flash --ranks 2 --device cuda --concurrency 1,4,16,32 --prompt-tokens 64 --max-tokens 64 --warmup 1
