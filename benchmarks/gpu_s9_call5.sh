#!/usr/bin/env bash
# Session 9 call 5 (nvidia-h200-x2, <= 4.5 min): main's final form (fuse_xproj and the boundary's one_pass_finish and
# warp_maps on by default): the replay and pool tests under the defaults, flash decode (5 rows of 64 tokens: issue 10
# target 1's protocol), then the gate on mini, 2 ranks, --batch 4.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s9_call5.sh
source benchmarks/gpu_env.sh
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 90 python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py \
    > "$OUT/pytest_defaults.txt" 2>&1; echo "pytest rc=$?" >> "$OUT/pytest_defaults.txt"
)
timeout 70 python -m dsv4.cli bench --preset flash --device cuda --ranks 2 --prime 64 --steps 64 --rows 5 \
  > "$OUT/bench_flash.txt" 2>&1; echo "rc=$?" >> "$OUT/bench_flash.txt"
timeout 85 python -m dsv4.cli gate --preset mini --device cuda --ranks 2 --prime 64 --output 64 --batch 4 \
  > "$OUT/gate_mini.txt" 2>&1; echo "gate rc=$?" >> "$OUT/gate_mini.txt"
