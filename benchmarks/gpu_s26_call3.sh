#!/usr/bin/env bash
# Session 26 call 3 (one H200, <= 9.5 min): moe_gl's grouped programs on by default (DSV4_MOE_GL_GROUPED; call 2
# ran them under the switch: their tests, the gate on mini, the server with every request's tokens unchanged).
#   1. the GPU suite whole on this tree (every batched step of more than one token now grouped);
#   2. the server on mini at concurrency 1 / 4 / 16 / 32 (IDENTITY);
#   3. the server's own pooled step at 16 and 32 rows profiled (v3 GEMVs for both families, as the server runs).
# Usage: OUT=dir bash benchmarks/gpu_s26_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
gpu_suite 330 "$OUT/pytest_gpu_suite.txt" --durations=5
step 90 "$OUT/serve_mini.txt" python benchmarks/serve_bench.py --preset mini --device cuda --concurrency 1,4,16,32 \
  --prompt-tokens 64 --max-tokens 64 --warmup 1
step 110 "$OUT/batch_mini_pool.txt" env DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 python benchmarks/batch_bench.py mini --pool \
  --sizes 16 32 --steps 32 --rows 3 --profile 16 32 --top 25
