#!/usr/bin/env bash
# Session 12 call 7 (nvidia-h200, one GPU, <= 3 min; the session's last device seconds): the MoE's pairs grouped by
# expert (dsv4.kernels.moe CONFIG grouped_pairs, DSV4_MOE_GROUPED; off by default), each FP4 weight tile decoded
# once for up to 8 pairs of one expert:
#   1. a grouped prefill of 16 x 63 tokens on mini, v3, with DSV4_MOE_GROUPED=128: its time (calls 5-6 without:
#      0.2818-0.2848 s) and the states' digest (must be call 5's 5fa892ffe594438f: the pair kernels' bits);
#   2. the grouped kernels' CUDA test (bits equal to the pair kernels, bf16 and fp32, alone == in the batch).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s12_call7.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=8
step 60 "$OUT/prefill_batch_mini_grouped.txt" env DSV4_MOE_GROUPED=128 DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 \
  python benchmarks/prefill_batch_bench.py mini --states 16 --tokens 63 --runs 2
step 70 "$OUT/pytest_grouped.txt" python -m pytest -q -p no:cacheprovider tests/test_moe_decode_options.py -k grouped
