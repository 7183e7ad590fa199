#!/usr/bin/env bash
# The next call on one H200 (<= 9 min), main's tree: the sweeps still without data, for the next tiles-by-shape rules
# (as qgemv.SHAPE_TILES):
#   1. the dense bf16/fp32 GEMVs of a decode step (the head, the compressors' and the router's), 1 and 16 rows,
#      world 1 and 2 (not swept since session 7);
#   2. the batched step's FP8 GEMVs on the tensor cores (v3) at 16 rows (world 2: a Flash rank's slices);
#   3. moe_gl's tensor-core experts at a Flash rank's shapes (world 2: 128 local experts) against the CUDA-core
#      programs, 1 and 16 tokens, mma_unroll 2 / 4 / 8 (session 16 swept world 1 only).
#   0. first, session 17's one test change not yet run on the device: tests/test_moe_options_gpu.py on moe.py's
#      kernels (moe_gl off), alone (it builds mini; session 17 call 5 cut it at 75 s while compiling); then mini's
#      solo graph with DSV4_PDL 0 / 1 / 0 (session 17 took ~35 torch launches out of the chain of Triton kernels:
#      does PDL pay more now? session 15: +1.5 %); then kernels/hc_head.py under DSV4_HC_HEAD=1 (written after
#      session 17's last call, off by default): its CUDA tests, graph == eager / pooled == solo, mini's solo graph
#      with it (if all pass: its GPU_CHECKED on, and the gate on mini under it).
# (The mHC boundary's launch configurations were swept in session 16, call 1: the defaults are the best.)
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_one_next.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=14
step 180 "$OUT/pytest_moe_options_gpu.txt" python -m pytest -q -p no:cacheprovider tests/test_moe_options_gpu.py
for pdl in 0 1 0; do
  DSV4_PDL=$pdl step 70 "$OUT/bench_mini_pdl$pdl-$SECONDS.txt" python -m dsv4.cli bench --preset mini --device cuda \
    --ranks 1 --prime 64 --steps 64 --rows 3
done
DSV4_HC_HEAD=1 step 120 "$OUT/pytest_hc_head.txt" python -m pytest -q -p no:cacheprovider -n 4 tests/test_hc_head.py \
  tests/test_replay_gpu.py tests/test_pool.py
DSV4_HC_HEAD=1 step 60 "$OUT/bench_mini_hc_head.txt" python -m dsv4.cli bench --preset mini --device cuda --ranks 1 \
  --prime 64 --steps 64 --rows 3
for world in 1 2; do
  step 100 "$OUT/dense_world$world.txt" python benchmarks/dense_bench.py --world $world --rows 1,16
done
step 100 "$OUT/qgemv_rows16.txt" python benchmarks/qgemv_bench.py --world 2 --rows 1,16 --arms '^v[23]'
step 120 "$OUT/moe_mma_world2.txt" python benchmarks/moe_bench.py --world 2 --tokens 1,16 --arms '^gl$|^gl_mma' \
  --calls 16
