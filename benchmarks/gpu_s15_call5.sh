#!/usr/bin/env bash
# Session 15 call 5 (nvidia-h200, one GPU, <= 6.5 min; the session's last device time): the server's warm-up at
# 15-token chunks (most chunks' lengths are not multiples of 16: Triton compiles those apart), a cold server's
# compiles after start; moe_gl under DSV4_PDL=1 (its kernels now release and wait): its tests and graph == eager
# under PDL; mini's solo graph with DSV4_PDL 0 then 1 (moe_gl in both).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s15_call5.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=14
DSV4_LOG_COMPILES=1 step 95 "$OUT/serve_mini_v3_cold.txt" python benchmarks/serve_bench.py --preset mini \
  --device cuda --gemv v3 --concurrency 1,4,16,32 --prompt-tokens 64 --max-tokens 64
DSV4_PDL=1 step 120 "$OUT/pytest_pdl_gl.txt" python -m pytest -q -p no:cacheprovider tests/test_moe_gl.py \
  tests/test_replay_gpu.py
for pdl in 0 1; do
  DSV4_PDL=$pdl step 55 "$OUT/bench_mini_pdl$pdl.txt" python -m dsv4.cli bench --preset mini --device cuda \
    --ranks 1 --prime 64 --steps 64 --rows 5
done
