#!/usr/bin/env bash
# Session 14 call 5 (nvidia-h200, one GPU, <= 8 min): main's final form: moe_gl on by default (DSV4_MOE_GLUON=0 for
# the pair kernels) and the sampler's kept set read as int32 (its one-byte flags changed the sums' order: call 4's
# batched row one token past its solo draw):
#   1. the sampler's tests (kernel 1's sums with a kept set of every token == without, bit for bit);
#   2. graph == eager and the pool's identities under the defaults, then with DSV4_MOE_GLUON=0; tests/test_moe_gl.py;
#   3. the gate on mini, --batch 4, 64/64; mini's solo graph (bench --profile); the pooled 16-row step (v3).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s14_call5.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
step 60 "$OUT/pytest_sampler.txt" python -m pytest -q -p no:cacheprovider tests/test_sample_kernel.py \
  tests/test_sampler.py tests/test_moe_gl.py
step 100 "$OUT/pytest_replay_pool.txt" python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py \
  tests/test_pool.py
step 100 "$OUT/pytest_replay_pool_gl0.txt" env DSV4_MOE_GLUON=0 python -m pytest -q -p no:cacheprovider \
  tests/test_replay_gpu.py tests/test_pool.py
step 100 "$OUT/gate_mini_64.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 \
  --prime 64 --output 64 --out "$OUT/receipts_gate_mini_64.txt"
step 60 "$OUT/bench_mini.txt" python -m dsv4.cli bench --preset mini --device cuda --ranks 1 --prime 64 \
  --steps 64 --rows 2 --profile
step 50 "$OUT/batch_mini_pool16.txt" env DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 python benchmarks/batch_bench.py mini \
  --sizes 16 --steps 32 --rows 3 --pool
