#!/usr/bin/env bash
# Session 27 call 3 on one H200 (<= 5 min): main's tree with call 1's two same-bits defaults (moe_gl's shared programs
# of 4 tokens, expert_groups' blocks form; call 2 ran its tests and the gate with them): the GPU files that run them
# (the Gluon experts, the table, the pooled steps, generation and the server's identity), then the server on mini at
# concurrency 1 / 4 / 16 / 32 and mini's solo decode.
# Usage: OUT=dir bash benchmarks/gpu_s27_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 150 "$OUT/pytest_moe_pool.txt" python -m pytest -q -p no:cacheprovider -n 4 --dist loadfile -rfE \
  tests/test_moe_gl.py tests/test_expert_groups.py tests/test_pool.py tests/test_generation_gpu.py \
  tests/test_moe_options_gpu.py
step 75 "$OUT/serve_mini.txt" python benchmarks/serve_bench.py --preset mini --device cuda --concurrency 1,4,16,32 \
  --prompt-tokens 64 --max-tokens 64 --warmup 1
step 60 "$OUT/bench_mini.txt" python -m dsv4.cli bench --preset mini --device cuda --prime 64 --steps 64 --rows 3
