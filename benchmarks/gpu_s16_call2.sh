#!/usr/bin/env bash
# Session 16 call 2 (nvidia-h200, one GPU, <= 9 min): moe_gl's routed programs of kernel 1 on the tensor cores
# (CONFIG mma, DSV4_MOE_MMA=1, off by default): its tests (against the pair kernels and the torch reference, each
# token alone == in the batch), one Flash layer's kernel 1 (moe_bench: gl against gl_mma*, 1 and 16 tokens); mini's
# solo graph under the defaults, with a one-token step's shared programs of 8 (before this session), and with mma;
# the pooled 16-row step (v3) without and with mma.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s16_call2.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
step 90 "$OUT/pytest_moe_gl.txt" python -m pytest -q -p no:cacheprovider tests/test_moe_gl.py
step 110 "$OUT/moe_mma.txt" python benchmarks/moe_bench.py --world 1 --tokens 1,16 --arms '^base$|^gl$|^gl_mma' \
  --calls 16
step 55 "$OUT/bench_mini_default.txt" python -m dsv4.cli bench --preset mini --device cuda --ranks 1 --prime 64 \
  --steps 64 --rows 3
DSV4_MOE_GL_SOLO_SHARED=8 step 50 "$OUT/bench_mini_solo8.txt" python -m dsv4.cli bench --preset mini --device cuda \
  --ranks 1 --prime 64 --steps 64 --rows 3
DSV4_MOE_MMA=1 step 55 "$OUT/bench_mini_mma.txt" python -m dsv4.cli bench --preset mini --device cuda --ranks 1 \
  --prime 64 --steps 64 --rows 3
for mma in 0 1; do
  DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 DSV4_MOE_MMA=$mma step 80 "$OUT/batch16_v3_mma$mma.txt" python \
    benchmarks/batch_bench.py mini --sizes 16 --steps 16 --rows 3 --pool
done
