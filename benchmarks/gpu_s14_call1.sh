#!/usr/bin/env bash
# Session 14 call 1 (nvidia-h200, one GPU, <= 9 min): the decode step's routed experts with the registers laid out by
# hand (dsv4.kernels.moe_gl, DSV4_MOE_GLUON=1, off by default):
#   1. tests/test_moe_gl.py on the GPU (against the pair kernels and torch; each token alone == in the batch; remote
#      experts unread; the ticketless sum);
#   2. one Flash layer's routed experts at 1 and 16 tokens, world 1 (mini's shape): pair kernels against the Gluon
#      arms (rows a thread, warps), kernel_us per kernel;
#   3. graph == eager and the pool's identities with the switch on;
#   4. mini's solo graph (bench --profile) and the pooled 16-row step (v3), off then on.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s14_call1.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 90 "$OUT/pytest_gl.txt" python -m pytest -q -p no:cacheprovider tests/test_moe_gl.py
step 120 "$OUT/moe_bench_gl.txt" python benchmarks/moe_bench.py --world 1 --tokens 1,16 --arms '^base$|^gl' --calls 16
step 110 "$OUT/pytest_replay_pool_gl.txt" env DSV4_MOE_GLUON=1 python -m pytest -q -p no:cacheprovider \
  tests/test_replay_gpu.py tests/test_pool.py
for g in 0 1; do
  step 60 "$OUT/bench_mini_gl$g.txt" env DSV4_MOE_GLUON=$g python -m dsv4.cli bench --preset mini --device cuda \
    --ranks 1 --prime 64 --steps 64 --rows 2 --profile
  step 60 "$OUT/batch_mini_pool16_gl$g.txt" env DSV4_MOE_GLUON=$g DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 \
    python benchmarks/batch_bench.py mini --sizes 16 --steps 32 --rows 3 --pool
done
