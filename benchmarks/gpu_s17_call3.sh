#!/usr/bin/env bash
# Session 17 call 3 (nvidia-h200, one GPU, <= 9 min): call 2's tests, cut there by their limits while compiling the
# unrolled tiles, now in 8 xdist workers (pytest-xdist carried in .whl): test_qgemv whole, graph == eager and
# batched / pooled == solo, the pair kernels' options; the gate on mini under the defaults; mini's solo graph.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s17_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
step 240 "$OUT/pytest_qgemv_replay_pool.txt" python -m pytest -q -p no:cacheprovider -n 8 tests/test_qgemv.py \
  tests/test_replay_gpu.py tests/test_pool.py tests/test_moe_options_gpu.py tests/test_moe_decode_options.py
step 120 "$OUT/gate_mini_batch4.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 \
  --prime 64 --output 64 --out "$OUT/receipts_gate_mini_64.txt"
left=$((530 - SECONDS))
if [ $left -gt 30 ]; then
  step $((left > 60 ? 60 : left)) "$OUT/bench_mini.txt" python -m dsv4.cli bench --preset mini --device cuda \
    --ranks 1 --prime 64 --steps 64 --rows 5
fi
