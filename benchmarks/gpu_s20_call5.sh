#!/usr/bin/env bash
# Session 20 call 5 (one H200), main's tree, measurements only: a prompt's prefill on mini, kernel by kernel
# (eager_host_profile --prefill), for the next session's TTFT work (call 4: a 64-token prefill 32 ms of device
# time, 44 % in the decode GEMV v2 at 63 rows a weight, 41 % in the prefill experts):
#   1. 128 tokens (the longest chunk that runs rows alone, MoE pair kernels' limit);
#   2. 256 tokens (the GEMM path: batch-dependent, longer than a short chunk);
#   3. 64 tokens with the tensor-core GEMVs (--gemv v3: DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s20_call5.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=14
step 75 "$OUT/prefill128_mini.txt" python benchmarks/eager_host_profile.py --preset mini --steps 2 --prefill 128 --top 12
step 75 "$OUT/prefill256_mini.txt" python benchmarks/eager_host_profile.py --preset mini --steps 2 --prefill 256 --top 12
step 75 "$OUT/prefill64_v3_mini.txt" env DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 python benchmarks/eager_host_profile.py \
  --preset mini --steps 2 --prefill 64 --top 12
