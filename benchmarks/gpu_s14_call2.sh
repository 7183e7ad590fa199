#!/usr/bin/env bash
# Session 14 call 2 (nvidia-h200, one GPU, <= 9 min): moe_gl with the shared expert's FP8 gate/up in the routed launch
# (and the K loop's prefetch as an arm), DSV4_MOE_GLUON=1 (off by default):
#   1. tests/test_moe_gl.py on the GPU (now with the shared expert in the routed launch);
#   2. moe_bench, world 1, 1 and 16 tokens: base / gl / gl_pf / gl_rn2_pf, and a layer's kernel 1 with the shared
#      expert (gate_up_and_shared);
#   3. graph == eager and the pool's identities with the switch on;
#   4. mini's solo graph (bench --profile) on, the pooled 16-row step (v3) on, and where the eager step's host time
#      goes with it on (call 1: eager 93.5 -> 57-73 tok/s).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s14_call2.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 90 "$OUT/pytest_gl.txt" python -m pytest -q -p no:cacheprovider tests/test_moe_gl.py
step 130 "$OUT/moe_bench_gl2.txt" python benchmarks/moe_bench.py --world 1 --tokens 1,16 \
  --arms '^base$|^gl$|^gl_pf$|^gl_rn2_pf$' --calls 16
step 110 "$OUT/pytest_replay_pool_gl.txt" env DSV4_MOE_GLUON=1 python -m pytest -q -p no:cacheprovider \
  tests/test_replay_gpu.py tests/test_pool.py
step 60 "$OUT/bench_mini_gl1.txt" env DSV4_MOE_GLUON=1 python -m dsv4.cli bench --preset mini --device cuda \
  --ranks 1 --prime 64 --steps 64 --rows 2 --profile
step 60 "$OUT/batch_mini_pool16_gl1.txt" env DSV4_MOE_GLUON=1 DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 \
  python benchmarks/batch_bench.py mini --sizes 16 --steps 32 --rows 3 --pool
step 60 "$OUT/eager_host_gl1.txt" env DSV4_MOE_GLUON=1 python benchmarks/eager_host_profile.py --preset mini --steps 32
