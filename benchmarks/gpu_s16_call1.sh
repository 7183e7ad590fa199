#!/usr/bin/env bash
# Session 16 call 1 (nvidia-h200, one GPU, <= 9 min): a one-token step's shared-expert programs of 1 token
# (moe_gl shared_tokens_solo, DSV4_MOE_GL_SOLO_SHARED): its tests (each token alone == in a step of 20, both solo
# sizes), the layer's kernel 1 (moe_bench, gl vs gl_solo8) and mini's solo graph off then on; where a pooled
# 16-row step's time goes (batch_bench --profile 16); the mHC boundary's launch configurations (1 and 16 rows).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s16_call1.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
step 70 "$OUT/pytest_moe_gl.txt" python -m pytest -q -p no:cacheprovider tests/test_moe_gl.py
step 110 "$OUT/moe_gl.txt" python benchmarks/moe_bench.py --world 1 --tokens 1,16 --arms '^base$|^gl' --calls 16
for solo in 8 1; do
  DSV4_MOE_GL_SOLO_SHARED=$solo step 50 "$OUT/bench_mini_solo$solo.txt" python -m dsv4.cli bench --preset mini \
    --device cuda --ranks 1 --prime 64 --steps 64 --rows 3
done
step 140 "$OUT/batch16_profile.txt" python benchmarks/batch_bench.py mini --sizes 16 --steps 16 --rows 2 --pool \
  --profile 16 --profile-steps 8 --top 40
step 90 "$OUT/hc_boundary.txt" python benchmarks/hc_boundary_bench.py --rows 1,16 --arms '^fused'
