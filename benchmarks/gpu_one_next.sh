#!/usr/bin/env bash
# The next call on one H200 (<= 9.5 min), main's tree: where mini's step can still lose time, each candidate swept
# alone before any kernel is rewritten (session 19 measured the step kernel by kernel with advances: the experts
# ~251 us a token at ~0.45 of the copy bandwidth, the mHC boundaries 92.5, attention 71.8, the compressor's small
# kernels ~67; RESULTS.md session 19 call 1; its expert-loop kernel 2 and L2 prefetches lost and were reverted):
#   1. mini's bench (the pipelined arm is the steady measure) and kernel_table --sequence under the defaults;
#   2. the experts at one token, world 1 (mini's and a Flash rank's expert shapes are the same), every Gluon arm
#      (rows a thread, warps, mma unroll: kernel 2 is 1,536 programs of 16 KB at one token);
#   3. decode attention's launch configs (block_n, tiles, heads a program, warps) at Flash's rank shapes;
#   4. the mHC boundary at 1 row; 5. the dense bf16/fp32 GEMVs at 1 row (the compressor's wkv/wgate ran at ~0.43).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_one_next.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=14
step 120 "$OUT/bench_mini_default.txt" python -m dsv4.cli bench --preset mini --device cuda --ranks 1 --prime 64 \
  --steps 64 --rows 3
step 60 "$OUT/kernel_table_mini.txt" python benchmarks/kernel_table.py --preset mini --device cuda --steps 16 \
  --top 45 --sequence
step 90 "$OUT/moe_world1_t1.txt" python benchmarks/moe_bench.py --world 1 --tokens 1 --arms '^gl' --calls 16
step 80 "$OUT/attention.txt" python benchmarks/attention_bench.py
step 60 "$OUT/hc_boundary.txt" python benchmarks/hc_boundary_bench.py --rows 1
left=$((560 - SECONDS))
[ $left -gt 40 ] && step $left "$OUT/dense_world1.txt" python benchmarks/dense_bench.py --world 1 --rows 1
