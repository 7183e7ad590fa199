#!/usr/bin/env bash
# Session 10 call 2 (nvidia-h200-x2, <= 8 min): the side lane (DSV4_OVERLAP) and the graph-timed phase profile.
# GPU 0: the replay, pool and profile tests under the defaults (attention's regrouped launches, overlap off);
# GPU 1 at the same time: tests/test_lanes.py (overlap on == off, eager, graph, pooled batch). Then flash decode:
# --profile under the defaults (phases timed inside the graph), then 3 rows of 64 with DSV4_OVERLAP=0 and =1.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s10_call2.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 230 python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py tests/test_profile.py \
    > "$OUT/pytest_defaults.txt" 2>&1; echo "pytest rc=$?" >> "$OUT/pytest_defaults.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 230 python -m pytest -q -p no:cacheprovider tests/test_lanes.py \
    > "$OUT/pytest_lanes.txt" 2>&1; echo "pytest rc=$?" >> "$OUT/pytest_lanes.txt"
) &
wait
timeout 170 python -m dsv4.cli bench --preset flash --device cuda --ranks 2 --prime 64 --steps 32 --rows 2 --profile \
  > "$OUT/bench_flash_profile.txt" 2>&1; echo "rc=$?" >> "$OUT/bench_flash_profile.txt"
for o in 0 1; do
  DSV4_OVERLAP=$o timeout 85 python -m dsv4.cli bench --preset flash --device cuda --ranks 2 --prime 64 --steps 64 \
    --rows 3 > "$OUT/bench_flash_overlap$o.txt" 2>&1; echo "rc=$?" >> "$OUT/bench_flash_overlap$o.txt"
done
