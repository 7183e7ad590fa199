#!/usr/bin/env bash
# Session 14 call 3 (nvidia-h200, one GPU, <= 9.5 min): moe_gl with one compiled size for the shared expert's programs
# (8 tokens a program), DSV4_MOE_GLUON=1 (off by default):
#   1. tests/test_moe_gl.py on the GPU, then graph == eager and the pool's identities with the switch on (call 2: the
#      batched graphs failed with per-size shared programs);
#   2. moe_bench, world 1, a layer's kernel 1 with the shared expert at 1 and 16 tokens: 8 and 4 tokens a program;
#   3. the eager step's host time, off then on, in one call;
#   4. mini: solo graph and the pooled 16-row step (v3) with the switch on; the gate, --batch 4, 64/64.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s14_call3.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
step 60 "$OUT/pytest_gl.txt" python -m pytest -q -p no:cacheprovider tests/test_moe_gl.py
step 110 "$OUT/pytest_replay_pool_gl.txt" env DSV4_MOE_GLUON=1 python -m pytest -q -p no:cacheprovider \
  tests/test_replay_gpu.py tests/test_pool.py
step 80 "$OUT/moe_bench_gl3.txt" python benchmarks/moe_bench.py --world 1 --tokens 1,16 --arms '^gl$|^gl_s4$' --calls 16
for g in 0 1; do
  step 30 "$OUT/eager_host_gl$g.txt" env DSV4_MOE_GLUON=$g python benchmarks/eager_host_profile.py --preset mini \
    --steps 16
done
step 60 "$OUT/bench_mini_gl1.txt" env DSV4_MOE_GLUON=1 python -m dsv4.cli bench --preset mini --device cuda \
  --ranks 1 --prime 64 --steps 64 --rows 2 --profile
step 60 "$OUT/batch_mini_pool16_gl1.txt" env DSV4_MOE_GLUON=1 DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 \
  python benchmarks/batch_bench.py mini --sizes 16 --steps 32 --rows 3 --pool
step 100 "$OUT/gate_mini_64_gl1.txt" env DSV4_MOE_GLUON=1 python -m dsv4.cli gate --preset mini --device cuda \
  --ranks 1 --batch 4 --prime 64 --output 64 --out "$OUT/receipts_gate_mini_64_gl1.txt"
