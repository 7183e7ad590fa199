#!/usr/bin/env bash
# One device call on 2 x H200 (nvidia-h200-x2), ~8 minutes: batched decode's identity and where a token's
# time goes. Outputs under a scratch folder ($RES), returned as $OUT/results.tgz plus $OUT/summary.txt.
#   phase 1, in parallel:
#     GPU 0: benchmarks/batch_invariance.py on mini (which kernel module, if any, makes a batched row differ
#            from the same row alone), then the CUDA tests of the new kernels and replay (DSV4_KERNELS=triton:
#            commit_step, normrope, test_replay_gpu with the batched graph against solo graphs);
#     GPU 1: kernel tables of mini (triton, auto); the HTTP server on mini at concurrency 1, 4, 16 (needs the
#            serving wheels carried in .whl: openai, fastapi, uvicorn, ...);
#   phase 2, both GPUs: the gate on mini, 2 ranks, with --batch 4 ($MINI_PRIME/$MINI_OUTPUT, default 128),
#            then flash's kernel table on 2 ranks (triton).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_batch_checks.sh
source benchmarks/gpu_env.sh
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 150 python benchmarks/batch_invariance.py --preset mini > "$OUT/invariance.txt" 2>&1
  echo "invariance rc=$?" >> "$OUT/invariance.txt"
  DSV4_KERNELS=triton timeout 170 python -m pytest -q -p no:cacheprovider tests/test_commit_step.py \
    tests/test_normrope.py tests/test_replay_gpu.py > "$OUT/pytest.txt" 2>&1
  echo "pytest rc=$? kernels=triton" >> "$OUT/pytest.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  for k in triton auto; do
    DSV4_KERNELS=$k timeout 80 python benchmarks/kernel_table.py --preset mini --device cuda --steps 16 \
      > "$OUT/table_mini_$k.txt" 2>&1
    echo "kernel_table rc=$? kernels=$k" >> "$OUT/table_mini_$k.txt"
  done
  timeout 130 python benchmarks/serve_bench.py --preset mini --device cuda --concurrency 1,4,16 \
    --prompt-tokens 64 --max-tokens 32 --level-timeout 30 > "$OUT/serve_mini.txt" 2>&1
  echo "serve_bench rc=$?" >> "$OUT/serve_mini.txt"
) &
wait
/usr/bin/time -f "wall %e s" -o "$OUT/gate_mini_time.txt" timeout 150 python -m dsv4.cli gate --preset mini \
  --device cuda --ranks 2 --prime "${MINI_PRIME:-128}" --output "${MINI_OUTPUT:-128}" --batch 4 \
  --out "$OUT/gate_mini.txt" > "$OUT/gate_mini_stdout.txt" 2>&1
echo "gate rc=$?" >> "$OUT/gate_mini_time.txt"
DSV4_KERNELS=triton timeout "${FLASH_TABLE_TIMEOUT:-160}" python benchmarks/kernel_table.py --preset flash \
  --device cuda --ranks 2 --steps 16 > "$OUT/table_flash_triton.txt" 2>&1
echo "kernel_table rc=$? kernels=triton" >> "$OUT/table_flash_triton.txt"
