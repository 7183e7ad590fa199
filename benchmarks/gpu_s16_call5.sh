#!/usr/bin/env bash
# Session 16 call 5 (nvidia-h200, one GPU, <= 9.5 min): moe_gl's tensor-core programs for both kernels (kernel 2's
# down projection too), DSV4_MOE_MMA=1: tests; under it graph == eager, batched == solo, pooled == solo; one Flash
# layer's routed experts (moe_bench); mini's solo graph A/B/A (default, mma, default); the gate on mini under it;
# then, if time is left, the pooled 16-row step (v3) without and with.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s16_call5.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
step 80 "$OUT/pytest_moe_gl.txt" python -m pytest -q -p no:cacheprovider tests/test_moe_gl.py
DSV4_MOE_MMA=1 step 110 "$OUT/pytest_replay_pool_mma.txt" python -m pytest -q -p no:cacheprovider \
  tests/test_replay_gpu.py tests/test_pool.py
step 80 "$OUT/moe_mma.txt" python benchmarks/moe_bench.py --world 1 --tokens 1,16 \
  --arms '^gl$|^gl_mma1x4$|^gl_mma1x4_up$|^gl_mma1x2$' --calls 16
step 70 "$OUT/bench_mini_a1.txt" python -m dsv4.cli bench --preset mini --device cuda --ranks 1 --prime 64 --steps 64 --rows 2
DSV4_MOE_MMA=1 step 45 "$OUT/bench_mini_b_mma.txt" python -m dsv4.cli bench --preset mini --device cuda --ranks 1 \
  --prime 64 --steps 64 --rows 3
step 45 "$OUT/bench_mini_a2.txt" python -m dsv4.cli bench --preset mini --device cuda --ranks 1 --prime 64 --steps 64 --rows 3
DSV4_MOE_MMA=1 step 110 "$OUT/gate_mini_batch4_mma.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 \
  --batch 4 --prime 64 --output 64 --out "$OUT/receipts_gate_mini_64_mma.txt"
for mma in 0 1; do
  if [ $SECONDS -lt 470 ]; then
    DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 DSV4_MOE_MMA=$mma step $((540 - SECONDS > 60 ? 60 : 540 - SECONDS)) \
      "$OUT/batch16_v3_mma$mma.txt" python benchmarks/batch_bench.py mini --sizes 16 --steps 16 --rows 3 --pool
  fi
done
