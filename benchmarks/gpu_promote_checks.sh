#!/usr/bin/env bash
# One device call on 2 x H200 (nvidia-h200-x2), ~9 minutes: the checks that let switched-off paths go live,
# and the batch gate at the seed's sizes. Outputs under $RES, returned as $OUT/results.tgz + $OUT/summary.txt.
#   phase 1, in parallel:
#     GPU 0: the sampler's CUDA tests (a batched row's CDF bits == the row alone) and
#            benchmarks/sampler_invariance.py (the old scans against the per-row one); the dense GEMV's
#            CUDA tests and replay identity under DSV4_KERNELS=triton (dense in the graph);
#            benchmarks/sampling_check.py (the logit-processing stage, solo == batch == graph);
#     GPU 1: benchmarks/dense_bench.py (the dense GEMV against cuBLAS per Flash shape); the HTTP server on
#            mini with --precapture (needs the serving wheels carried in .whl);
#   (one GPU: the lanes in turn, the gate on 1 rank, no flash)
#   phase 2, both GPUs: the gate on mini, 2 ranks, 256/256 --batch 4 (failed in session 4 at row 3, step 20);
#            then flash decode on 2 ranks, one process per arm in $FLASH_ARMS (label=env assignments).
# Usage: OUT=dir [RES=/tmp/res] [FLASH_ARMS="auto:DSV4_KERNELS=auto dense_symm:DSV4_KERNELS=triton,DSV4_REDUCE=symm"]
#        bash benchmarks/gpu_promote_checks.sh
source benchmarks/gpu_env.sh
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 60 python -m pytest -q -p no:cacheprovider tests/test_sampler.py > "$OUT/pytest_sampler.txt" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_sampler.txt"
  timeout 60 python benchmarks/sampler_invariance.py > "$OUT/sampler_invariance.txt" 2>&1
  echo "rc=$?" >> "$OUT/sampler_invariance.txt"
  DSV4_KERNELS=triton timeout 200 python -m pytest -q -p no:cacheprovider tests/test_dense_kernel.py \
    tests/test_replay_gpu.py > "$OUT/pytest_dense_triton.txt" 2>&1
  echo "pytest rc=$? kernels=triton" >> "$OUT/pytest_dense_triton.txt"
  DSV4_UNCHECKED_SAMPLING=1 timeout 120 python benchmarks/sampling_check.py --preset mini --device cuda --rows 4 \
    --steps 24 > "$OUT/sampling_check.txt" 2>&1
  echo "rc=$?" >> "$OUT/sampling_check.txt"
) &
GPUS=$(nvidia-smi -L | wc -l)
[ "$GPUS" -lt 2 ] && wait  # one GPU: the two lanes run one after the other
(
  export CUDA_VISIBLE_DEVICES=$((GPUS - 1))
  timeout 200 python benchmarks/dense_bench.py > "$OUT/dense_bench.txt" 2>&1
  echo "rc=$?" >> "$OUT/dense_bench.txt"
  timeout 150 python benchmarks/serve_bench.py --preset mini --device cuda --concurrency 1,4,16 \
    --prompt-tokens 64 --max-tokens 32 --level-timeout 30 > "$OUT/serve_mini_precapture.txt" 2>&1
  echo "serve_bench rc=$?" >> "$OUT/serve_mini_precapture.txt"
) &
wait
/usr/bin/time -f "wall %e s" -o "$OUT/gate_mini_time.txt" timeout "${GATE_TIMEOUT:-200}" python -m dsv4.cli gate \
  --preset mini --device cuda --ranks "$(( GPUS < 2 ? 1 : 2 ))" --prime 256 --output 256 --batch 4 \
  --out "$OUT/gate_mini.txt" > "$OUT/gate_mini_stdout.txt" 2>&1
echo "gate rc=$?" >> "$OUT/gate_mini_time.txt"
[ "$GPUS" -lt 2 ] && exit 0  # flash needs two H200s
for arm in ${FLASH_ARMS:-auto:DSV4_KERNELS=auto dense_symm:DSV4_KERNELS=triton,DSV4_REDUCE=symm}; do
  label=${arm%%:*}; assigns=${arm#*:}
  env ${assigns//,/ } timeout "${FLASH_TIMEOUT:-110}" python -m dsv4.cli bench --preset flash --device cuda --ranks 2 \
    --prime 64 --steps 32 --rows 2 > "$OUT/bench_flash_$label.txt" 2>&1
  echo "bench rc=$? $assigns" >> "$OUT/bench_flash_$label.txt"
done
