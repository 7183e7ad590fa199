#!/usr/bin/env bash
# Session 13 call 4 (nvidia-h200, one GPU, <= 9 min): the prefill chunks' experts on the tensor cores by default
# (dsv4.kernels.moe_tc mode "chunks": the "words" loop, 64 outputs, K steps of 128, 3 stages; decode steps keep the
# pair kernels), checked and measured in the final form:
#   1. the CUDA tests of moe_tc, prefill (incl. prefill_moe and the short chunk's pair path), the grouped prefill,
#      the MoE options;
#   2. graph == eager, the pool's identities (test_replay_gpu, test_pool) under the defaults;
#   3. the 16 x 63 prefill wave on mini, v3 (states equal one by one; call 1: 0.27 s with the pair kernels);
#   4. the gate on mini, --batch 4, 64/64 (batched == solo after a prefill through the tensor cores);
#   5. the server on mini, v3, concurrency 1, 4, 16, 32 after a warm-up round (session 12 call 4: 487 / 998 /
#      1,385 / 1,464 tok/s).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s13_call4.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=14
step 150 "$OUT/pytest_tc_prefill.txt" python -m pytest -q -p no:cacheprovider tests/test_moe_tc.py \
  tests/test_prefill.py tests/test_prefill_batch.py tests/test_moe_decode_options.py
step 100 "$OUT/pytest_replay_pool.txt" python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py
step 50 "$OUT/prefill_batch_mini.txt" env DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 \
  python benchmarks/prefill_batch_bench.py mini --states 16 --tokens 63 --runs 3
step 100 "$OUT/gate_mini_64.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 \
  --prime 64 --output 64 --out "$OUT/receipts_gate_mini_64.txt"
step 150 "$OUT/serve_mini_v3.txt" python benchmarks/serve_bench.py --preset mini --device cuda --gemv v3 \
  --concurrency 1,4,16,32 --prompt-tokens 64 --max-tokens 64 --warmup 1
