#!/usr/bin/env bash
# Session 19, call 4 on one H200 (<= 9 min): main's final CUDA code (session 18's kernels; the embedding's gather as
# index_select; generate's pipelined loop):
#   1. the gate on mini (replay correctness, live refusal cells in the replayed graph, batched == solo, pipelined);
#   2. graph == eager (test_replay_gpu), pooled / pipelined == solo (test_pool), generate's loop (test_generation_gpu);
#   3. the server on mini, concurrency 1 and 16 (issue 12; session 17: 520.0 / 2,073.1 tok/s);
#   4. mini's bench under the defaults.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s19_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=14
step 150 "$OUT/gate_mini_batch4.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 \
  --prime 64 --output 64 --out "$OUT/receipts-gate-mini-64-batch4.txt"
step 130 "$OUT/pytest_replay_pool_generation.txt" python -m pytest -q -p no:cacheprovider -n 3 \
  tests/test_replay_gpu.py tests/test_pool.py tests/test_generation_gpu.py
step 130 "$OUT/serve_mini_v3.txt" python benchmarks/serve_bench.py --preset mini --device cuda --gemv v3 \
  --concurrency 1,16 --prompt-tokens 64 --max-tokens 64 --warmup 1
left=$((525 - SECONDS))
[ $left -gt 30 ] && step $left "$OUT/bench_mini_default.txt" python -m dsv4.cli bench --preset mini --device cuda \
  --ranks 1 --prime 64 --steps 64 --rows 3
