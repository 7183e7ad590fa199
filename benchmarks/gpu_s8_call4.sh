#!/usr/bin/env bash
# Session 8, call 4 (nvidia-h200-x2, <= 7 min): main's final form, the fused experts' three launch options on by
# default (kernels/moe.py gate_up_paired, down_split_experts, shared_launch; equal bits): tests/test_moe_options_gpu.py
# (each option's bytes on mini, graph == eager), the MoE kernel tests, replay and pool tests, the pool launch-count
# diagnosis (benchmarks/pool_launch_diag.py), the gate on mini (2 ranks, --batch 4), flash decode with and without
# shared_launch.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s8_call4.sh
source benchmarks/gpu_env.sh
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 130 python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py \
    > "$OUT/pytest_replay_pool.txt" 2>&1; echo "pytest rc=$?" >> "$OUT/pytest_replay_pool.txt"
  timeout 60 python benchmarks/pool_launch_diag.py > "$OUT/pool_diag.txt" 2>&1; echo "rc=$?" >> "$OUT/pool_diag.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 100 python -m pytest -q -p no:cacheprovider tests/test_moe_options_gpu.py \
    > "$OUT/pytest_moe.txt" 2>&1; echo "pytest rc=$? test_moe_options_gpu" >> "$OUT/pytest_moe.txt"
  timeout 70 python -m pytest -q -p no:cacheprovider tests/test_qgemv.py -k "moe or shared" \
    >> "$OUT/pytest_moe.txt" 2>&1; echo "pytest rc=$? test_qgemv moe" >> "$OUT/pytest_moe.txt"
) &
wait
timeout 100 python -m dsv4.cli gate --preset mini --device cuda --ranks 2 --prime 64 --output 64 --batch 4 \
  --out "$OUT/gate_mini.txt" > "$OUT/gate_mini_stdout.txt" 2>&1; echo "gate rc=$?" >> "$OUT/gate_mini_stdout.txt"
for arm in "" "DSV4_MOE_SHARED_LAUNCH=0"; do
  name=$(echo "${arm:-default}" | tr ' =' '_-')
  timeout 70 env $arm python -m dsv4.cli bench --preset flash --device cuda --ranks 2 --prime 64 --steps 32 \
    --rows 2 > "$OUT/bench_flash_$name.txt" 2>&1; echo "rc=$? $arm" >> "$OUT/bench_flash_$name.txt"
done
