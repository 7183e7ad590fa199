#!/usr/bin/env bash
# Issue 10, branch pdlw (nvidia-h200-x2, <= 5 min): programmatic dependent launch with the weight fetched before the
# wait (DSV4_PDL=1; off by default). Every kernel releases its successor first; qgemv's v2 linear, dense on a stored
# weight and the shared expert's gate/up programs launch with launch_pdl, load their first weight tile and then wait
# (griddepcontrol.wait) before they read anything the step wrote.
#   phase 1, in parallel (<= 120 s):
#     GPU 0: test_replay_gpu and test_pool with DSV4_PDL=1 (graph == eager bit for bit with PDL edges in the graphs,
#            batched == solo);
#     GPU 1: test_qgemv and test_dense_kernel with DSV4_PDL=1 on CUDA (the kernels against their references; the
#            early tile's bits equal main's loop: test_v2_early_tile_keeps_the_bits, test_stored_weight_keeps_the_bits);
#            QGEMV_BENCH=1 (off by default: ~1.5 min more) then qgemv_bench's default v2 arm with DSV4_PDL=0 and =1
#            (per shape a graph of back-to-back launches rotating over weight copies; QGEMV records carry `pdl`);
#   phase 2, both GPUs: flash decode with DSV4_PDL=0, =1, =0 again (ABA: the machine drifts), each `timeout 80`:
#     tok/s and ms/token (session 9: 7.99 ms/token, 1,094 graph nodes per token per rank).
# Usage: OUT=dir [RES=/tmp/res] [QGEMV_BENCH=1] bash benchmarks/gpu_pdlw.sh
source benchmarks/gpu_env.sh
(
  export CUDA_VISIBLE_DEVICES=0 DSV4_PDL=1
  timeout 120 python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py \
    > "$OUT/pytest_replay_pool_pdl.txt" 2>&1
  echo "pytest rc=$? DSV4_PDL=1" >> "$OUT/pytest_replay_pool_pdl.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  DSV4_PDL=1 timeout 120 python -m pytest -q -p no:cacheprovider tests/test_qgemv.py tests/test_dense_kernel.py \
    > "$OUT/pytest_gemv_pdl.txt" 2>&1
  echo "pytest rc=$? DSV4_PDL=1" >> "$OUT/pytest_gemv_pdl.txt"
  for pdl in $([ "${QGEMV_BENCH:-0}" = 1 ] && echo 0 1); do
    DSV4_PDL=$pdl timeout 45 python benchmarks/qgemv_bench.py --arms "^v2_default\$" \
      > "$OUT/qgemv_bench_pdl$pdl.txt" 2>&1
    echo "rc=$? DSV4_PDL=$pdl" >> "$OUT/qgemv_bench_pdl$pdl.txt"
  done
) &
wait
for run in a b c; do
  pdl=$([ $run = b ] && echo 1 || echo 0)
  DSV4_PDL=$pdl timeout 80 python -m dsv4.cli bench --preset flash --device cuda --ranks 2 --prime 64 --steps 64 \
    --rows 3 > "$OUT/bench_flash_${run}_pdl$pdl.txt" 2>&1
  echo "rc=$? DSV4_PDL=$pdl" >> "$OUT/bench_flash_${run}_pdl$pdl.txt"
done
