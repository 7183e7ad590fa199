#!/usr/bin/env bash
# One device call on 2 x H200 (nvidia-h200-x2): the GPU checks and benchmarks of a change, results under $OUT.
#   phase 1, in parallel:
#     GPU 0: every CUDA test (kernels against their references, replay identity on mini) under
#            DSV4_KERNELS=$KERNELS (default auto: the GPU-checked kernels), then mini against HF (fp32);
#     GPU 1: KERNEL_BENCH=1: the kernel benchmarks (GEMV and MoE, attention, compressor); mini decode
#            with the torch reference and with $KERNELS; SERVE_BENCH=1: the HTTP server on mini;
#   phase 2, both GPUs, in this order:
#     MINI_GATE=1:   the gate on mini at the seed's sizes (256/256, 2 ranks);
#     FLASH_BENCH=1: flash decode on 2 ranks with the phase profile (dsv4 bench --profile);
#                    FLASH_SYMM=1 also with the one-shot all-reduce over symmetric memory (DSV4_REDUCE=symm);
#     PREFILL=1:     flash prefill of 4096 tokens on 2 ranks (benchmarks/prefill_bench.py);
#     FLASH_PRIME/FLASH_OUTPUT > 0: the gate on flash at those sizes;
#     FLASH_SERVE=1: the HTTP server on flash, 2 ranks, at concurrency 1, 4, 16 (benchmarks/serve_bench.py).
#     BATCH_BENCH=1: batched decode on flash, 2 ranks, at batch sizes $BATCH_SIZES (benchmarks/batch_bench.py);
#   HF=0 skips mini against HF; MINI_PRIME/MINI_OUTPUT size the mini gate (default the seed's 256/256);
#   BATCH=B: the gates also check B sequences in one batched step against each alone (--batch B).
# Every output is written under a scratch folder and comes back as one archive, $OUT/results.tgz
# (the device tool returns at most 8 files), next to $OUT/summary.txt (the tail of each output).
# Usage: OUT=dir [KERNELS=auto|triton] [KERNEL_BENCH=1] [SERVE_BENCH=1] [FLASH_BENCH=1] [FLASH_SYMM=1] [PREFILL=1] \
#        [MINI_GATE=1] [FLASH_PRIME=64 FLASH_OUTPUT=64] bash benchmarks/gpu_checks.sh
SUMMARY_LINES=25
source benchmarks/gpu_env.sh
KERNELS=${KERNELS:-auto}
BATCH=${BATCH:-0}
(
  export CUDA_VISIBLE_DEVICES=0 DSV4_KERNELS=$KERNELS
  timeout "${PYTEST_TIMEOUT:-200}" python -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_qgemv.py \
    tests/test_attention_kernel.py tests/test_compressor_kernel.py tests/test_route_kernel.py tests/test_door_kernel.py \
    tests/test_prefill.py tests/test_dense_kernel.py tests/test_sampler.py tests/test_replay_gpu.py > "$OUT/pytest_gpu.txt" 2>&1
  echo "pytest rc=$? kernels=$KERNELS" >> "$OUT/pytest_gpu.txt"
  [ "${HF:-1}" = 1 ] && timeout 80 python benchmarks/mini_vs_hf.py 300 > "$OUT/mini_vs_hf.txt" 2>&1
) &
(
  export CUDA_VISIBLE_DEVICES=1
  if [ "${KERNEL_BENCH:-0}" = 1 ]; then
    timeout 150 python benchmarks/qgemv_bench.py --world 2 --arms 'torch|default|v2_n8|fused_n8|fused_k512' > "$OUT/qgemv.txt" 2>&1
    timeout 60 python benchmarks/attention_bench.py > "$OUT/attention.txt" 2>&1
    timeout 60 python benchmarks/compressor_bench.py > "$OUT/compressor.txt" 2>&1
  fi
  for k in torch $KERNELS; do
    DSV4_KERNELS=$k timeout 60 python -m dsv4.cli bench --preset mini --device cuda --prime 128 --steps 64 --rows 2 \
      >> "$OUT/bench_mini.txt" 2>&1
  done
  if [ "${SERVE_BENCH:-0}" = 1 ]; then
    DSV4_KERNELS=$KERNELS timeout 120 python benchmarks/serve_bench.py --preset mini --device cuda --concurrency 1,4,16 \
      --prompt-tokens 64 --max-tokens 32 --level-timeout 30 > "$OUT/serve_mini.txt" 2>&1
    echo "serve_bench rc=$?" >> "$OUT/serve_mini.txt"
  fi
) &
wait
if [ "${MINI_GATE:-0}" = 1 ]; then
  /usr/bin/time -f "wall %e s" -o "$OUT/gate_mini_time.txt" env DSV4_KERNELS=$KERNELS timeout 300 \
    python -m dsv4.cli gate --preset mini --device cuda --ranks 2 --prime "${MINI_PRIME:-256}" --output "${MINI_OUTPUT:-256}" \
    --batch "$BATCH" --out "$OUT/gate_mini.txt" > "$OUT/gate_mini_stdout.txt" 2>&1
  echo "gate rc=$? kernels=$KERNELS" >> "$OUT/gate_mini_time.txt"
fi
flash_bench() {  # $1: label, rest: env assignments
  local label=$1; shift
  env DSV4_KERNELS=$KERNELS "$@" timeout "${FLASH_BENCH_TIMEOUT:-150}" python -m dsv4.cli bench --preset flash \
    --device cuda --ranks 2 --prime 64 --steps 32 --rows 2 --profile > "$OUT/bench_flash_$label.txt" 2>&1
  echo "bench rc=$? $*" >> "$OUT/bench_flash_$label.txt"
}
if [ "${FLASH_BENCH:-0}" = 1 ]; then
  flash_bench base
  [ "${FLASH_SYMM:-0}" = 1 ] && flash_bench symm DSV4_REDUCE=symm
fi
if [ "${PREFILL:-0}" = 1 ]; then
  DSV4_KERNELS=$KERNELS timeout 150 python benchmarks/prefill_bench.py flash --sizes 4096 --runs 2 \
    > "$OUT/prefill_flash.txt" 2>&1
  echo "prefill rc=$?" >> "$OUT/prefill_flash.txt"
fi
if [ "${FLASH_PRIME:-0}" -gt 0 ]; then
  /usr/bin/time -f "wall %e s" -o "$OUT/gate_flash_time.txt" env DSV4_KERNELS=$KERNELS timeout "${GATE_TIMEOUT:-300}" \
    python -m dsv4.cli gate --preset flash --device cuda --ranks 2 --prime "$FLASH_PRIME" --output "$FLASH_OUTPUT" --batch "$BATCH" \
    --out "$OUT/gate_flash.txt" > "$OUT/gate_flash_stdout.txt" 2>&1
  echo "gate rc=$? kernels=$KERNELS" >> "$OUT/gate_flash_time.txt"
fi
if [ "${BATCH_BENCH:-0}" = 1 ]; then
  DSV4_KERNELS=$KERNELS timeout "${BATCH_BENCH_TIMEOUT:-240}" python benchmarks/batch_bench.py flash --ranks 2 \
    --sizes ${BATCH_SIZES:-1 4 16 32} --steps 24 --rows 3 > "$OUT/batch_flash.txt" 2>&1
  echo "batch_bench rc=$?" >> "$OUT/batch_flash.txt"
fi
if [ "${FLASH_SERVE:-0}" = 1 ]; then
  DSV4_KERNELS=$KERNELS timeout "${SERVE_TIMEOUT:-240}" python benchmarks/serve_bench.py --preset flash --device cuda \
    --ranks 2 --concurrency 1,4,16 --prompt-tokens 64 --max-tokens 48 --level-timeout 60 > "$OUT/serve_flash.txt" 2>&1
  echo "serve_bench rc=$?" >> "$OUT/serve_flash.txt"
fi
