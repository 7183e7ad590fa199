#!/usr/bin/env bash
# Session 15 call 2 (nvidia-h200, one GPU, <= 9 min): the GEMV's tiles by shape (qgemv.SHAPE_TILES, on), moe_tc's
# plan compiled once (DSV4_MOE_TC_PLAN_FIXED on) and prefill attention's tile counts rounded to powers of two:
#   1. their CUDA tests; graph == eager and the pool's identities under the new defaults;
#   2. mini's solo graph with the tiles by shape off then on (one call), the GEMVs per shape (world 2 slices);
#   3. the server on mini at concurrency 1, 4, 16, 32 with its compiles logged.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s15_call2.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
step 120 "$OUT/pytest_kernels.txt" python -m pytest -q -p no:cacheprovider tests/test_qgemv.py \
  tests/test_prefill_attention.py tests/test_moe_tc.py -x
step 100 "$OUT/pytest_replay_pool.txt" python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py \
  tests/test_pool.py
for tiles in 0 1; do
  DSV4_QGEMV_SHAPE_TILES=$tiles step 55 "$OUT/bench_mini_tiles$tiles.txt" python -m dsv4.cli bench --preset mini \
    --device cuda --ranks 1 --prime 64 --steps 64 --rows 3
done
step 45 "$OUT/qgemv_world2.txt" python benchmarks/qgemv_bench.py --world 2 --arms '^v2_(default|flat)$'
DSV4_LOG_COMPILES=1 step 80 "$OUT/serve_mini_v3.txt" python benchmarks/serve_bench.py --preset mini --device cuda \
  --gemv v3 --concurrency 1,4,16,32 --prompt-tokens 64 --max-tokens 64 --warmup 1
step 75 "$OUT/pytest_prefill_batch.txt" python -m pytest -q -p no:cacheprovider tests/test_prefill_batch.py
