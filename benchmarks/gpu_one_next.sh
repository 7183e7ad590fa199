#!/usr/bin/env bash
# The next call on one H200 (<= 9 min), main's tree: the sweeps session 15 had no device time for, each kernel's
# launch configurations at Flash's shapes, so that the next tiles-by-shape rule (as qgemv.SHAPE_TILES) has data:
#   1. the mHC boundary (86 a Flash token: ~9 us each, ~10 % of a token): block_d 16 / 64 / 128 and the finish options,
#      1 and 16 rows;
#   2. the dense bf16/fp32 GEMVs of a decode step (the head, the compressors' and the router's), 1 and 16 rows,
#      world 1 and 2;
#   3. the batched step's FP8 GEMVs on the tensor cores (v3) at 16 rows, and the Gluon experts' tiles at 1 and 16
#      tokens (one Flash layer, world 1).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_one_next.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=14
step 100 "$OUT/hc_boundary.txt" python benchmarks/hc_boundary_bench.py --rows 1,16 --arms '^fused'
for world in 1 2; do
  step 100 "$OUT/dense_world$world.txt" python benchmarks/dense_bench.py --world $world --rows 1,16
done
step 100 "$OUT/qgemv_rows16.txt" python benchmarks/qgemv_bench.py --world 2 --rows 1,16 --arms '^v[23]'
step 100 "$OUT/moe_gl.txt" python benchmarks/moe_bench.py --world 1 --tokens 1,16 --arms '^base$|^gl' --calls 16
