#!/usr/bin/env bash
# Session 16 call 3 (nvidia-h200, one GPU, <= 9 min): moe_gl's tensor-core routed programs, second form (16-byte
# loads, the group's scale folded into the weights' bf16/fp16 pairs): tests and one Flash layer's kernel 1 against
# the CUDA-core kernel; main's defaults (a one-token step's shared programs of 1 token): graph == eager, batched ==
# solo, pooled == solo (test_replay_gpu, test_pool); mini's solo graph A/B/A (defaults, shared programs of 8,
# defaults; the first run compiles).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s16_call3.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
step 90 "$OUT/pytest_moe_gl.txt" python -m pytest -q -p no:cacheprovider tests/test_moe_gl.py
step 120 "$OUT/pytest_replay_pool.txt" python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py
step 90 "$OUT/bench_mini_a1.txt" python -m dsv4.cli bench --preset mini --device cuda --ranks 1 --prime 64 --steps 64 --rows 3
DSV4_MOE_GL_SOLO_SHARED=8 step 50 "$OUT/bench_mini_b_solo8.txt" python -m dsv4.cli bench --preset mini --device cuda \
  --ranks 1 --prime 64 --steps 64 --rows 3
step 50 "$OUT/bench_mini_a2.txt" python -m dsv4.cli bench --preset mini --device cuda --ranks 1 --prime 64 --steps 64 --rows 3
step 90 "$OUT/moe_mma.txt" python benchmarks/moe_bench.py --world 1 --tokens 1,16 --arms '^gl$|^gl_mma' --calls 16
