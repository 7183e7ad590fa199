#!/usr/bin/env bash
# Session 17 call 5 (nvidia-h200, one GPU, <= 5 min: the session's last device time): main's final CUDA code (the
# step kernels on by default): test_moe_options_gpu on moe.py's kernels; the step kernels' tests under the
# defaults; mini's solo graph; the server on mini at concurrency 1 and 16.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s17_call5.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=14
step 75 "$OUT/pytest_moe_options_gpu.txt" python -m pytest -q -p no:cacheprovider tests/test_moe_options_gpu.py
step 40 "$OUT/pytest_step_kernels.txt" python -m pytest -q -p no:cacheprovider tests/test_rope_table.py \
  tests/test_bookkeeping.py tests/test_kernels.py -k "gpu_checked or tables or begin or settle or model_steps"
step 55 "$OUT/bench_mini.txt" python -m dsv4.cli bench --preset mini --device cuda --ranks 1 --prime 64 --steps 64 --rows 3
left=$((290 - SECONDS))
if [ $left -gt 40 ]; then
  step $left "$OUT/serve_mini_v3.txt" python benchmarks/serve_bench.py --preset mini --device cuda --gemv v3 \
    --concurrency 1,16 --prompt-tokens 64 --max-tokens 64 --warmup 1
fi
