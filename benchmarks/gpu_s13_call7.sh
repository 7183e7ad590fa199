#!/usr/bin/env bash
# Session 13 call 7 (nvidia-h200, one GPU, <= 2.5 min): the prefill chunks' experts at Flash's per-rank shape (rank 0
# of 2: 128 local FP4 experts), pair kernels against the tensor cores (moe_tc, the default for chunks): a lone
# 64-token chunk and a wave of 16 such chunks (1,024 tokens), one MoE layer, kernels' device time beside.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s13_call7.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
step 110 "$OUT/moe_bench_flash_chunks.txt" python benchmarks/moe_bench.py --world 2 --tokens 64,1024 \
  --arms '^base$|^tc$' --calls 4
