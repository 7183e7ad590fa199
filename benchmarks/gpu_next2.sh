#!/usr/bin/env bash
# After gpu_next.sh (one H200, <= 5 min): the server's concurrency-16 wave with DSV4_MOE_TC_WAVE_TILES off / on
# (session 22, off by default: a grouped wave's experts in tiles by its pairs per expert, the same bits). --warmup 1
# absorbs the 32-row tiles' compile (the server's warm-up does not wave them yet). IDENTITY must hold in both, and
# the REQUEST records' ids_sha must match between the arms (the same bits).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_next2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
for arm in 0 1; do
  step 90 "$OUT/serve_mini_c16_wave$arm.txt" env DSV4_MOE_TC_WAVE_TILES=$arm python benchmarks/serve_bench.py \
    --preset mini --device cuda --concurrency 1,16 --prompt-tokens 64 --max-tokens 64 --warmup 1
done
