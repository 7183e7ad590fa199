#!/usr/bin/env bash
# The next call on one H200 (<= 9.5 min), main's tree (session 18's defaults: DSV4_PDL on, every kernel in the chain;
# DSV4_HC_HEAD on):
#   1. mini's solo graph interleaved: defaults / DSV4_ATTN_FUSED_COMBINE=1 (decode attention's combine in the split
#      launch: no gain on flash at session 10 without PDL; under PDL one launch less a layer may pay) / defaults /
#      DSV4_PDL=0 (a third A/B of session 18's default, at one host load);
#   2. the server on mini under the new defaults (v3, pipelined rounds, steady state), concurrency 1 and 16 (issue 12;
#      session 17: 520.0 / 2,073.1 tok/s);
#   3. the experts at one token, world 1 (mini's and a Flash rank's expert shapes are the same): the routed down
#      kernel reads ~25 MB in ~14.3 us a layer on mini (~0.42 of the copy bandwidth, the step's weakest big kernel;
#      session 17's table): routed - gate_up per arm, the rows a thread / warps / mma unroll;
#   4. if time is left, the dense bf16/fp32 GEMVs of a decode step swept at 1 and 16 rows (not since session 7).
# benchmarks/gpu_one_hf.sh (mini against HF's generate on the same weights) is a call of its own.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_one_next.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=14
BENCH="python -m dsv4.cli bench --preset mini --device cuda --ranks 1 --prime 64 --steps 64 --rows 3"
step 110 "$OUT/bench_mini_1_default.txt" $BENCH  # the cold machine's compiles
DSV4_ATTN_FUSED_COMBINE=1 step 70 "$OUT/bench_mini_2_fused_combine.txt" $BENCH
step 45 "$OUT/bench_mini_3_default.txt" $BENCH
DSV4_PDL=0 step 75 "$OUT/bench_mini_4_pdl0.txt" $BENCH
step 130 "$OUT/serve_mini_v3.txt" python benchmarks/serve_bench.py --preset mini --device cuda --gemv v3 \
  --concurrency 1,16 --prompt-tokens 64 --max-tokens 64 --warmup 1
step 70 "$OUT/moe_world1_t1.txt" python benchmarks/moe_bench.py --world 1 --tokens 1 --arms '^gl' --calls 16
left=$((560 - SECONDS))
[ $left -gt 40 ] && step $left "$OUT/dense_world1.txt" python benchmarks/dense_bench.py --world 1 --rows 1,16
