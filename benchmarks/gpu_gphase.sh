#!/usr/bin/env bash
# Branch gphase (nvidia-h200-x2, <= 8.5 min): `dsv4 bench --profile` with the phases timed inside a replayed CUDA graph
# (event nodes at each phase's enter and exit: dsv4.measure.graph_phases). First the CUDA test of the timed graph
# (tiny: phases sum to the replay, every phase's intervals, the state untouched), then mini on 1 rank and flash on 2.
# Look at BENCH_PROFILE: phases_us_per_token (us, us_mean, intervals), instrumented_us_per_token against
# plain_us_per_token (overhead_us_per_token: the events' own cost), and plain against the BENCH_SUMMARY graph tok/s.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_gphase.sh
source benchmarks/gpu_env.sh
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 180 python -m pytest -q -p no:cacheprovider tests/test_profile.py \
    > "$OUT/pytest_profile.txt" 2>&1; echo "pytest rc=$?" >> "$OUT/pytest_profile.txt"
  timeout 120 python -m dsv4.cli bench --preset mini --device cuda --ranks 1 --prime 32 --steps 16 --rows 2 --profile \
    > "$OUT/bench_mini_profile.txt" 2>&1; echo "rc=$?" >> "$OUT/bench_mini_profile.txt"
)
timeout 200 python -m dsv4.cli bench --preset flash --device cuda --ranks 2 --prime 64 --steps 32 --rows 2 --profile \
  > "$OUT/bench_flash_profile.txt" 2>&1; echo "rc=$?" >> "$OUT/bench_flash_profile.txt"
