#!/usr/bin/env bash
# The next call on one H200 (<= 3 min; written as session 29's call 5, not run: the session's device time ran out):
# where the server's time goes at concurrency 16 on mini, for the next choice (measurements only):
#   1. a prefill wave of 16 63-token chunks (the server's 64-token prompts at concurrency 16): its kernels
#      (--profile) and its host side (--pyprofile): device-bound or host-bound, as call 3 found one chunk;
#   2. the pooled decode step at 16 rows with the server's GEMVs (mma, dense v3): its kernels.
# Usage: OUT=dir bash benchmarks/gpu_next.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=60
PB="python benchmarks/prefill_batch_bench.py mini --tokens 63 --states 16 --runs 2"
step 60 "$OUT/prefill_wave_profile.txt" $PB --profile 20
step 50 "$OUT/prefill_wave_pyprofile.txt" $PB --pyprofile 30
step 55 "$OUT/batch_mini_pool_mma.txt" env DSV4_QGEMV=mma DSV4_DENSE_GEMV=v3 python benchmarks/batch_bench.py mini \
  --pool --sizes 16 --steps 16 --rows 1 --profile 16 --top 20
