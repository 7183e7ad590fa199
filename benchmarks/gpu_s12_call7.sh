#!/usr/bin/env bash
# The grouped expert kernels' first device run (<= 4 min, one H200; written in session 12, whose device time ran
# out before it): the MoE's pairs grouped by expert (dsv4.kernels.moe CONFIG grouped_pairs / DSV4_MOE_GROUPED, off by
# default; group_rows / DSV4_MOE_GROUP_ROWS pairs a group), each FP4 weight tile decoded once for a group's pairs:
#   1. the grouped kernels' CUDA test (bits equal to the pair kernels, bf16 and fp32, alone == in the batch);
#   2. a grouped prefill of 16 x 63 tokens on mini, v3, grouped with 8 and 4 rows a group: its time (session 12
#      calls 5-6 without: 0.2818-0.2848 s) and the states' digest (must be call 5's 5fa892ffe594438f);
#   3. one Flash-shape layer's routed experts at 16 decode tokens (moe_bench --world 1), grouped from 16 pairs
#      (call 5's pair kernels: gate/up 390.0 us, routed 606.8).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s12_call7.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=8
step 70 "$OUT/pytest_grouped.txt" python -m pytest -q -p no:cacheprovider tests/test_moe_decode_options.py -k grouped
for rows in 8 4; do
  step 60 "$OUT/prefill_batch_mini_grouped$rows.txt" env DSV4_MOE_GROUPED=128 DSV4_MOE_GROUP_ROWS=$rows \
    DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 python benchmarks/prefill_batch_bench.py mini --states 16 --tokens 63 --runs 2
done
step 55 "$OUT/moe_bench_grouped.txt" env DSV4_MOE_GROUPED=16 python benchmarks/moe_bench.py --world 1 --tokens 16 \
  --arms '^base$' --calls 16
