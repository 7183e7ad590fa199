#!/usr/bin/env bash
# One device call on 2 x H200 (nvidia-h200-x2), <= 9.5 minutes: what session 5 left measured but off, and the
# flash server. Outputs under $RES, returned as $OUT/results.tgz + $OUT/summary.txt.
#   phase 1, in parallel:
#     GPU 0: replay identity (graph == eager, batched graph == solo graphs) with the split sums fused into the
#            GEMV (DSV4_FUSED_SPLIT_SUM=1): bit-equal per launch in session 5, not yet through a whole model;
#     GPU 1: the MoE gate/up variants at Flash's shapes (benchmarks/moe_bench.py, T = 1 and 4);
#   phase 2, both GPUs:
#     the gate on mini at the seed's sizes, --batch 4, with the fused split sums;
#     flash decode, one process per arm: default; DSV4_FUSED_SPLIT_SUM=1; DSV4_REDUCE=symm (the one-shot
#     all-reduce over symmetric memory);
#     the HTTP server on flash, 2 ranks, at concurrency 1, 4, 16 (issue 12's load bench; slots pooled).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_next_checks.sh      (carry .whl for the server)
source benchmarks/gpu_env.sh
(
  export CUDA_VISIBLE_DEVICES=0 DSV4_FUSED_SPLIT_SUM=1
  timeout 150 python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_qgemv.py tests/test_moe_decode.py \
    tests/test_moe_decode_options.py \
    > "$OUT/pytest_fused_sum.txt" 2>&1
  echo "pytest rc=$? DSV4_FUSED_SPLIT_SUM=1" >> "$OUT/pytest_fused_sum.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 150 python benchmarks/moe_bench.py --tokens 1,4 > "$OUT/moe_bench.txt" 2>&1
  echo "rc=$?" >> "$OUT/moe_bench.txt"
) &
wait
DSV4_FUSED_SPLIT_SUM=1 timeout 150 python -m dsv4.cli gate --preset mini --device cuda --ranks 2 --prime 256 \
  --output 256 --batch 4 --out "$OUT/gate_mini_fused_sum.txt" > "$OUT/gate_mini_fused_sum_stdout.txt" 2>&1
echo "gate rc=$? DSV4_FUSED_SPLIT_SUM=1" >> "$OUT/gate_mini_fused_sum_stdout.txt"
for arm in base: fused_sum:DSV4_FUSED_SPLIT_SUM=1 symm:DSV4_REDUCE=symm; do
  label=${arm%%:*}; assigns=${arm#*:}
  env $assigns timeout 80 python -m dsv4.cli bench --preset flash --device cuda --ranks 2 --prime 64 --steps 32 \
    --rows 2 > "$OUT/bench_flash_$label.txt" 2>&1
  echo "bench rc=$? $assigns" >> "$OUT/bench_flash_$label.txt"
done
timeout 150 python benchmarks/serve_bench.py --preset flash --device cuda --ranks 2 --concurrency 1,4,16 \
  --prompt-tokens 64 --max-tokens 48 --level-timeout 40 > "$OUT/serve_flash.txt" 2>&1
echo "serve_bench rc=$?" >> "$OUT/serve_flash.txt"
