#!/usr/bin/env bash
# Branch xproj on 2 x H200 (nvidia-h200-x2), <= 5 minutes: a compressed layer's bf16 linears of the attention's input
# in one dense GEMV launch (DSV4_FUSE_XPROJ=1, dsv4.layout CONFIG fuse_xproj; off by default).
#   phase 1, in parallel (<= 150 s):
#     GPU 0, DSV4_KERNELS=triton: tests/test_xproj.py (the pool, index-keys and commit kernels on column views equal to
#            contiguous copies, the model on vs off within 1e-5 of the largest logit, batched == solo; its 2-rank case
#            runs on CPU, gloo), the kernels the views reach (test_compressor_kernel, test_commit_step,
#            test_kernels::test_commit) and test_syncguard (no host sync in a step, with the switch);
#     GPU 1, DSV4_KERNELS=auto: test_replay_gpu (mini: every CSA/HCA layer stacks; graph == eager over 256 steps,
#            batched graph == solo graphs) and test_pool with the switch.
#   Look for: every pytest rc=0.
#   phase 2, both GPUs: flash decode (dsv4 bench, 2 ranks) off then on. Look for, in BENCH_SUMMARY: same_stream true
#     in both, fuse_xproj false / true, graph_replay_kernels_per_token 104 lower with it on (4 on each of 21 CSA
#     layers, 1 on each of 20 HCA layers: preset("flash"); the dense GEMV sums its splits in the same launch by default) and
#     graph_tok_s up (expected ~0.3 ms a token off session 9's 8.29 ms).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_xproj_checks.sh
source benchmarks/gpu_env.sh
(
  export CUDA_VISIBLE_DEVICES=0 DSV4_KERNELS=triton DSV4_FUSE_XPROJ=1
  timeout 150 python -m pytest -q -p no:cacheprovider tests/test_xproj.py tests/test_compressor_kernel.py \
    tests/test_commit_step.py tests/test_syncguard.py tests/test_kernels.py::test_commit \
    > "$OUT/pytest_xproj_cuda.txt" 2>&1
  echo "pytest rc=$? DSV4_KERNELS=triton DSV4_FUSE_XPROJ=1" >> "$OUT/pytest_xproj_cuda.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1 DSV4_FUSE_XPROJ=1
  timeout 150 python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py \
    > "$OUT/pytest_replay_xproj.txt" 2>&1
  echo "pytest rc=$? DSV4_KERNELS=auto DSV4_FUSE_XPROJ=1" >> "$OUT/pytest_replay_xproj.txt"
) &
wait
for fuse in 0 1; do
  DSV4_FUSE_XPROJ=$fuse timeout 60 python -m dsv4.cli bench --preset flash --device cuda --ranks 2 --prime 64 \
    --steps 32 --rows 2 > "$OUT/bench_flash_xproj_$fuse.txt" 2>&1
  echo "rc=$? DSV4_FUSE_XPROJ=$fuse" >> "$OUT/bench_flash_xproj_$fuse.txt"
done
