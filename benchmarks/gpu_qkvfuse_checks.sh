#!/usr/bin/env bash
# Branch qkvfuse on 2 x H200 (nvidia-h200-x2), <= 4 minutes: attention's wq_a and wkv in one GEMV launch
# (DSV4_FUSE_QKV=1, dsv4.model.attention CONFIG fuse_qkv; off by default).
#   phase 1, in parallel (<= 110 s):
#     GPU 0: the CUDA tests with the switch on (DSV4_KERNELS=triton): tests/test_qkvfuse.py (fused vs unfused logits
#            within 1e-5 of the largest, batched == solo), the norm kernels on strided rows (test_normrope,
#            test_kernels -k norm), the FP8 linears (test_qgemv -k linear);
#     GPU 1: test_replay_gpu with the switch on (mini: FP8, q_lora_rank 1024, so every layer stacks): graph == eager
#            over 256 steps, batched graph == solo graphs.
#   phase 2, both GPUs: flash decode (dsv4 bench, 2 ranks) off then on: tok/s and kernel nodes per token per rank
#     (expected: 43 fewer nodes with it on, 1,412 -> ~1,369; the BENCH records name fuse_qkv).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_qkvfuse_checks.sh
source benchmarks/gpu_env.sh
(
  export CUDA_VISIBLE_DEVICES=0 DSV4_KERNELS=triton DSV4_FUSE_QKV=1
  timeout 110 python -m pytest -q -p no:cacheprovider tests/test_qkvfuse.py tests/test_normrope.py \
    tests/test_kernels.py tests/test_qgemv.py -k "qkvfuse or stack or norm or fused or linear" \
    > "$OUT/pytest_qkvfuse_cuda.txt" 2>&1
  echo "pytest rc=$? DSV4_KERNELS=triton DSV4_FUSE_QKV=1" >> "$OUT/pytest_qkvfuse_cuda.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1 DSV4_FUSE_QKV=1
  timeout 110 python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py > "$OUT/pytest_replay_fuse_qkv.txt" 2>&1
  echo "pytest rc=$? DSV4_KERNELS=auto DSV4_FUSE_QKV=1" >> "$OUT/pytest_replay_fuse_qkv.txt"
) &
wait
for fuse in 0 1; do
  DSV4_FUSE_QKV=$fuse timeout 65 python -m dsv4.cli bench --preset flash --device cuda --ranks 2 --prime 64 \
    --steps 32 --rows 2 > "$OUT/bench_flash_fuse_qkv_$fuse.txt" 2>&1
  echo "rc=$? DSV4_FUSE_QKV=$fuse" >> "$OUT/bench_flash_fuse_qkv_$fuse.txt"
done
