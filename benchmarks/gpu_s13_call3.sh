#!/usr/bin/env bash
# Session 13 call 3 (nvidia-h200, one GPU, <= 7 min): where the tensor-core experts' time goes, and two other forms
# of their K loop (dsv4.kernels.moe_tc CONFIG loop, DSV4_MOE_TC_LOOP; all off by default):
#   1. the tests with the "words" loop (int32 words, eight nibble planes, a scale per 4 words; 64 outputs, K 128);
#   2. moe_bench at 1 and 16 tokens: the pair kernels, the "tile" loop (call 2), "planes", "words" at several tile
#      shapes, each arm with its kernels' device time (kernel_us);
#   3. mini with the words loop: the 16 x 63 prefill wave and the pooled batched graph at 1 and 16 rows (v3).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s13_call3.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
W="DSV4_MOE_TC_LOOP=words DSV4_MOE_TC_BLOCK_N=64 DSV4_MOE_TC_BLOCK_K=128"
step 80 "$OUT/pytest_tc_words.txt" env $W python -m pytest -q -p no:cacheprovider tests/test_moe_tc.py
step 170 "$OUT/moe_bench_tc3.txt" python benchmarks/moe_bench.py --world 1 --tokens 1,16 \
  --arms '^base$|^tc$|^tcp_n64_k128_s3$|^tcw' --calls 16
step 60 "$OUT/prefill_batch_mini_tcw.txt" env DSV4_MOE_TC=1 $W DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 \
  python benchmarks/prefill_batch_bench.py mini --states 16 --tokens 63 --runs 2
step 80 "$OUT/batch_mini_pool_tcw.txt" env DSV4_MOE_TC=1 $W DSV4_KERNELS=triton DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 \
  python benchmarks/batch_bench.py mini --sizes 1 16 --steps 32 --rows 3 --pool
