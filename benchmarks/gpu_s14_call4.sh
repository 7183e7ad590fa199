#!/usr/bin/env bash
# Session 14 call 4 (nvidia-h200, one GPU, <= 7 min): moe_gl's routed + shared launch compiled once for every step size
# (T not specialised: Triton makes an integer argument equal to 1 a constant, so the solo step ran another binary
# than the batched ones), DSV4_MOE_GLUON=1 (off by default):
#   1. graph == eager and the pool's identities with the switch on, then tests/test_moe_gl.py;
#   2. mini's kernels, eager and graph arms (kernel_table: where the eager step's extra 6 ms goes);
#   3. the gate on mini, --batch 4, 64/64; the server on mini, v3, concurrency 1 and 16.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s14_call4.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=24
step 110 "$OUT/pytest_replay_pool_gl.txt" env DSV4_MOE_GLUON=1 python -m pytest -q -p no:cacheprovider \
  tests/test_replay_gpu.py tests/test_pool.py
step 50 "$OUT/pytest_gl.txt" python -m pytest -q -p no:cacheprovider tests/test_moe_gl.py
step 70 "$OUT/kernel_table_mini_gl1.txt" env DSV4_MOE_GLUON=1 python benchmarks/kernel_table.py --preset mini \
  --steps 16 --top 14
step 100 "$OUT/gate_mini_64_gl1.txt" env DSV4_MOE_GLUON=1 python -m dsv4.cli gate --preset mini --device cuda \
  --ranks 1 --batch 4 --prime 64 --output 64 --out "$OUT/receipts_gate_mini_64_gl1.txt"
step 110 "$OUT/serve_mini_v3_gl1.txt" env DSV4_MOE_GLUON=1 python benchmarks/serve_bench.py --preset mini \
  --device cuda --gemv v3 --concurrency 1,16 --prompt-tokens 64 --max-tokens 64 --warmup 1
