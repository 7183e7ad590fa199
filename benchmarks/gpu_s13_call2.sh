#!/usr/bin/env bash
# Session 13 call 2 (nvidia-h200, one GPU, <= 9.5 min): the routed experts on the tensor cores (dsv4.kernels.moe_tc,
# DSV4_MOE_TC=1, off by default), first device run:
#   1. its CUDA tests (the one-program plan == torch's; against the pair kernels; each token alone == in the batch,
#      bf16 and fp32), the MoE options' tests, prefill_moe's (its tile loop now shared with moe_tc);
#   2. one Flash-shape layer's routed experts at 1 and 16 decode tokens (moe_bench --world 1): the pair kernels
#      against the tensor-core tile shapes;
#   3. the 16 x 63 prefill wave on mini, v3, tensor cores (call 1: 0.27-0.28 s with the pair kernels);
#   4. mini's batched graph at 1 and 16 rows, pooled, v3, tensor cores (call 1: 16 rows 6.77 ms);
#   5. graph == eager and the pooled identities with the tensor cores on (test_replay_gpu, test_pool).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s13_call2.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
step 110 "$OUT/pytest_tc.txt" python -m pytest -q -p no:cacheprovider tests/test_moe_tc.py \
  tests/test_moe_decode_options.py tests/test_prefill.py -k "tc or plan or moe or prefill_moe or fp4"
step 140 "$OUT/moe_bench_tc.txt" python benchmarks/moe_bench.py --world 1 --tokens 1,16 --arms '^base$|^tc' \
  --calls 16
step 60 "$OUT/prefill_batch_mini_tc.txt" env DSV4_MOE_TC=1 DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 \
  python benchmarks/prefill_batch_bench.py mini --states 16 --tokens 63 --runs 2
step 80 "$OUT/batch_mini_pool_tc.txt" env DSV4_MOE_TC=1 DSV4_KERNELS=triton DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 \
  python benchmarks/batch_bench.py mini --sizes 1 16 --steps 32 --rows 3 --pool
step 150 "$OUT/pytest_replay_pool_tc.txt" env DSV4_MOE_TC=1 python -m pytest -q -p no:cacheprovider -x \
  tests/test_replay_gpu.py tests/test_pool.py
