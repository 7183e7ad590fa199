#!/usr/bin/env bash
# Session 12 call 5 (nvidia-h200, one GPU, <= 8.5 min): the MoE's (token, expert) pairs in their experts' order
# (dsv4.kernels.moe CONFIG order_pairs, DSV4_MOE_ORDER; default: launches of >= 128 pairs).
#   1. its CUDA tests (ordered == token order, bits; kernel 2's split form; the shared launch) and the other MoE
#      options' and the grouped prefill's (each state's bytes grouped == alone) under the defaults;
#   2. a grouped prefill of 16 x 63 tokens on mini (the server's concurrency-16 wave), v3, order off then on: time and
#      the states' digest (must be equal);
#   3. one flash-shape layer's routed experts at 16 decode tokens, all 256 experts local (mini's), order off / on.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s12_call5.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=10
step 140 "$OUT/pytest_moe_prefill.txt" python -m pytest -q -p no:cacheprovider tests/test_moe_decode_options.py \
  tests/test_prefill_batch.py
for order in 0 128; do
  step 75 "$OUT/prefill_batch_mini_order$order.txt" env DSV4_MOE_ORDER=$order DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 \
    python benchmarks/prefill_batch_bench.py mini --states 16 --tokens 63 --runs 3
done
for order in 0 16; do
  step 55 "$OUT/moe_bench_order$order.txt" env DSV4_MOE_ORDER=$order python benchmarks/moe_bench.py --world 1 \
    --tokens 16 --arms '^base$' --calls 16
done
