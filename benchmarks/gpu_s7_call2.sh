#!/usr/bin/env bash
# Session 7, call 2 (nvidia-h200-x2, <= 8 min): kernels/draw.py promoted and the shared add on by default (tree s7).
#   phase A, in parallel (<= 150 s):
#     GPU 0: the draw kernel on CUDA against the torch draw and the host draw, the sampler's tests, then
#            test_replay_gpu under the defaults (graph == eager);
#     GPU 1: qgemv_bench and dense_bench at 1 and 16 rows: v2 against v3's arms (rows_exact each).
#   phase B, both GPUs: the gate on mini, 2 ranks, --batch 4 with v3 on; serve_bench flash at concurrency 1 and 16,
#     default kernels, then v3 on.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s7_call2.sh
source benchmarks/gpu_env.sh
V3="DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3"
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 60 python -m pytest -q -p no:cacheprovider tests/test_draw_kernel.py tests/test_sampler.py \
    > "$OUT/pytest_draw_sampler.txt" 2>&1
  echo "pytest rc=$? draw+sampler (auto)" >> "$OUT/pytest_draw_sampler.txt"
  timeout 90 python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py > "$OUT/pytest_replay_auto.txt" 2>&1
  echo "pytest rc=$? replay (auto)" >> "$OUT/pytest_replay_auto.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 75 python benchmarks/qgemv_bench.py --rows 1,16 \
    --arms '^(v2_rows1|v2_rows8|v3_default|v3_n16|v3_n64_k128|v3_programs528|v3_nosplit)$' > "$OUT/qgemv_rows.txt" 2>&1
  echo "rc=$?" >> "$OUT/qgemv_rows.txt"
  timeout 70 python benchmarks/dense_bench.py --rows 1,16 \
    --arms '^(cublas|kernel_default|kernel_v3|kernel_v3_n16_k512|kernel_v3_n64_k128|kernel_v3_programs528)$' \
    > "$OUT/dense_rows.txt" 2>&1
  echo "rc=$?" >> "$OUT/dense_rows.txt"
) &
wait
timeout 110 env $V3 python -m dsv4.cli gate --preset mini --device cuda --ranks 2 --prime 128 --output 128 \
  --batch 4 --out "$OUT/gate_mini_128_batch4_v3.txt" > "$OUT/gate_mini_stdout.txt" 2>&1
echo "gate rc=$?" >> "$OUT/gate_mini_stdout.txt"
timeout 95 python benchmarks/serve_bench.py --preset flash --device cuda --ranks 2 --concurrency 1,16 \
  --prompt-tokens 64 --max-tokens 64 --level-timeout 15 > "$OUT/serve_flash.txt" 2>&1
echo "serve_bench rc=$?" >> "$OUT/serve_flash.txt"
timeout 95 env $V3 python benchmarks/serve_bench.py --preset flash --device cuda --ranks 2 --concurrency 1,16 \
  --prompt-tokens 64 --max-tokens 64 --level-timeout 15 > "$OUT/serve_flash_v3.txt" 2>&1
echo "serve_bench rc=$? v3" >> "$OUT/serve_flash_v3.txt"
