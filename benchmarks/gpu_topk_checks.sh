#!/usr/bin/env bash
# Issue 10 (branch topk) on one H200 (nvidia-h200), <= 4 minutes: the indexer's top-k in one launch
# (dsv4/kernels/topk.py, GPU_CHECKED = False; DSV4_KERNELS=triton runs it).
#   phase 1, side by side (neither timed):
#     the CUDA tests of the kernel and of the indexer through it (bits equal to torch.topk; the model's selection
#     unchanged), DSV4_KERNELS=triton;
#     test_replay_gpu under DSV4_KERNELS=triton (mini: graph replay == eager bit for bit with the kernel in the step);
#   phase 2, alone: benchmarks/topk_bench.py (TOPK records: torch.topk + compare against the kernel, us per call,
#     equal bits; TOPK_BEST per shape).
# Look for: every pytest rc=0; every TOPK kernel record "equal":true; TOPK_BEST kernel_us below torch_us at rows 1
# for n 2048 and 8192 (decode's stores at the benchmark's sizes: a few thousand keys) -> flip GPU_CHECKED; the best
# keys_per_thread -> CONFIG; n 16384 (spills ~0.5 KB) against torch -> keep or lower MAX_N.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_topk_checks.sh
source benchmarks/gpu_env.sh
export DSV4_KERNELS=triton
(
  timeout 110 python -m pytest -q -p no:cacheprovider tests/test_topk_kernel.py tests/test_compressor_kernel.py \
    > "$OUT/pytest_topk_kernel.txt" 2>&1
  echo "pytest rc=$? topk + compressor kernel tests (DSV4_KERNELS=triton)" >> "$OUT/pytest_topk_kernel.txt"
) &
(
  timeout 120 python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py > "$OUT/pytest_replay_triton.txt" 2>&1
  echo "pytest rc=$? test_replay_gpu (DSV4_KERNELS=triton)" >> "$OUT/pytest_replay_triton.txt"
) &
wait
timeout 100 python benchmarks/topk_bench.py > "$OUT/topk_bench.txt" 2>&1
echo "rc=$? topk_bench" >> "$OUT/topk_bench.txt"
