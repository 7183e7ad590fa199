#!/usr/bin/env bash
# The next call on one H200 (<= 9.5 min), main's tree: where a concurrency-16 server's first prefill wave (16 prompts x
# 63 tokens, ~95 ms on mini) spends its time. Session 23 call 1: the GPU's kernels take ~86 ms of it, the shared
# expert's fused CUDA-core kernel 28 of those; with DSV4_MOE_SHARED_PREFILL_TILES=1 (off by default: the shared expert
# on the tensor cores, other bits, the gate PASSED with it in session 22) the kernels take 68 ms but the wave stays at
# ~95 ms: the host's ~2,550 launches bound it. So:
#   1. the wave's host side under cProfile (--pyprofile: the Python functions of most own time), defaults;
#   2. the same with the shared tiles on, and its kernel profile (busy fraction);
#   3. the server at concurrency 1 and 16, shared tiles off and on (TTFT; IDENTITY must hold in each).
# What follows: the host's hot functions are the next change (fewer launches a state: the per-state loops of
# dsv4/model/attention.py and the geometry of dsv4/model/step.py); the shared tiles go on only once the host no
# longer hides their 18 ms (new bits: the gate and the GPU suite again).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_next.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=45
step 70 "$OUT/wave_host.txt" python benchmarks/prefill_batch_bench.py mini --states 16 --tokens 63 --runs 3 \
  --pyprofile 40
step 80 "$OUT/wave_host_shared.txt" env DSV4_MOE_SHARED_PREFILL_TILES=1 python benchmarks/prefill_batch_bench.py \
  mini --states 16 --tokens 63 --runs 3 --pyprofile 25 --profile 12
# DSV4_GEOMETRY_CHUNKS=1 (session 23, off by default, never run on a GPU): a short chunk's geometry in one launch per
# rate instead of ~50 torch launches a sequence (the decode kernels' SASS unchanged: the same digests). Its test on
# the GPU, then the wave with it: the digest must be step 1's, the host's share smaller.
step 40 "$OUT/pytest_geometry.txt" python -m pytest -q -p no:cacheprovider -rfE tests/test_geometry_kernel.py
step 70 "$OUT/wave_host_geometry.txt" env DSV4_GEOMETRY_CHUNKS=1 python benchmarks/prefill_batch_bench.py mini \
  --states 16 --tokens 63 --runs 3 --pyprofile 25
for arm in 0 1; do
  step 100 "$OUT/serve_mini_shared$arm.txt" env DSV4_MOE_SHARED_PREFILL_TILES=$arm python benchmarks/serve_bench.py \
    --preset mini --device cuda --concurrency 1,16 --prompt-tokens 64 --max-tokens 64 --warmup 1
done
