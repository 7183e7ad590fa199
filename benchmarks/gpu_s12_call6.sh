#!/usr/bin/env bash
# Session 12 call 6 (nvidia-h200, one GPU, <= 4 min): where a grouped prefill of 16 x 63 tokens goes on mini (the
# server's concurrency-16 wave: ~0.28 s, about 16 single chunks' time), v3: its kernels and busy fraction.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s12_call6.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
step 130 "$OUT/prefill_batch_mini_profile.txt" env DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 \
  python benchmarks/prefill_batch_bench.py mini --states 16 --tokens 63 --runs 2 --profile 25
