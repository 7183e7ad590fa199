#!/usr/bin/env bash
# Session 24 call 2 (one H200): DSV4_GEOMETRY_CHUNKS on by default (call 1: its GPU test passed, the 16 x 63 wave's
# digest unchanged, 98.6 -> 86.8 ms), its chunk kernels' block sizes now from the chunk's power of two alone. With
# the wave's host side cut, is the wave bound by its kernels? Then the two switches that shorten them pay:
# DSV4_MOE_SHARED_PREFILL_TILES=1 (the shared expert on v3: 86 -> 68 ms of kernels, other bits) and
# DSV4_MOE_TC_WAVE_TILES=1 (the wave's experts in 32-row tiles: 30.4 -> 23.0 ms, the same bits). The wave in each of
# the four arms, mini's prefill (logits_sha as before?), the geometry test, the server at concurrency 1 and 16 with
# neither and with both.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s24_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
step 40 "$OUT/pytest_geometry.txt" python -m pytest -q -p no:cacheprovider -rfE tests/test_geometry_kernel.py
for arm in 00 10 01 11; do
  step 45 "$OUT/wave_s${arm:0:1}w${arm:1:1}.txt" env DSV4_MOE_SHARED_PREFILL_TILES=${arm:0:1} \
    DSV4_MOE_TC_WAVE_TILES=${arm:1:1} python benchmarks/prefill_batch_bench.py mini --states 16 --tokens 63 --runs 5
done
step 45 "$OUT/prefill_mini.txt" python benchmarks/prefill_bench.py mini --sizes 64 128 512 --runs 5
for arm in 00 11; do
  step 100 "$OUT/serve_mini_s${arm:0:1}w${arm:1:1}.txt" env DSV4_MOE_SHARED_PREFILL_TILES=${arm:0:1} \
    DSV4_MOE_TC_WAVE_TILES=${arm:1:1} python benchmarks/serve_bench.py --preset mini --device cuda \
    --concurrency 1,16 --prompt-tokens 64 --max-tokens 64 --warmup 1
done
