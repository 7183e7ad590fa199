#!/usr/bin/env bash
# The next call on one H200 (<= 9.5 min), main's tree: DSV4_QGEMV_V3_UNROLL (session 24, off by default, never run on
# a GPU): qgemv v3's FP8 tile loop unrolled at compile time, as v2's since session 17 (v2: wo_a 13.99 -> 11.73 us,
# the same bits). Session 24 call 4 found v3 (the server's GEMVs: every row's bits its own at any batch) at ~0.32 of
# the bandwidth at 1 and 16 rows (a Flash layer's FP8 linears 55-60 us, v2 42 at one row), and mini's attention phase
# 517 us a token on v3 against 365 on v2: the concurrency-1 server's 1.35 ms a token against the bench's 1.18.
#   1. its tests on the GPU (the unrolled loop's bits == the loop's; v3's others with it on);
#   2. qgemv_bench at 1 and 16 rows, v3 with and without (bits_as_v3_default must be true), v2 beside;
#   3. mini's decode on v3 (`dsv4 bench --gemv v3 --profile`: the attention phase), off then on;
#   4. the server at concurrency 1 and 16, off then on (IDENTITY must hold; TPOT is the measure);
#   5. the concurrency-16 wave with the shared expert's tiles and the wave tiles, in-process A/B (--arm: session 24
#      call 2's arms ran one process each and spread by ~20 %), each arm's digest against the defaults'.
# If it pays: on by default (the same bits, so the gate's and the suite's streams are unchanged), then the gate on
# mini and the GPU suite (gpu_s24_call3.sh's two steps) before it lands.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_next.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=25
step 75 "$OUT/pytest_v3_unroll.txt" env DSV4_QGEMV_V3_UNROLL=1 python -m pytest -q -p no:cacheprovider -rfE \
  tests/test_qgemv.py -k "v3"
step 80 "$OUT/qgemv_v3_unroll.txt" python benchmarks/qgemv_bench.py --rows 1,16 --arms '^v3_(default|unroll)$|^v2_rows1$'
for arm in 0 1; do
  step 70 "$OUT/bench_mini_v3_unroll$arm.txt" env DSV4_QGEMV_V3_UNROLL=$arm python -m dsv4.cli bench --preset mini \
    --gemv v3 --prime 64 --steps 64 --rows 3 --profile
done
for arm in 0 1; do
  step 85 "$OUT/serve_mini_v3_unroll$arm.txt" env DSV4_QGEMV_V3_UNROLL=$arm python benchmarks/serve_bench.py \
    --preset mini --device cuda --concurrency 1,16 --prompt-tokens 64 --max-tokens 64 --warmup 1
done
step 100 "$OUT/wave_ab.txt" python benchmarks/prefill_batch_bench.py mini --states 16 --tokens 63 --runs 7 \
  --arm shared=moe.shared_prefill_tiles=1 --arm wave=moe_tc.wave_tiles=1 \
  --arm both=moe.shared_prefill_tiles=1,moe_tc.wave_tiles=1
