#!/usr/bin/env bash
# eagerfast (nvidia-h200, <= 4 min): FastLaunch (DSV4_FAST_LAUNCH=1, dsv4/kernels/__init__.py) on a GPU.
#  1. fast_launch_check: mini's eager steps with Triton's launches and through FastLaunch in one process:
#     FAST_LAUNCH_CHECK equal=true (tokens, digests, logits) and off_ms_per_step vs on_ms_per_step (the first
#     process compiles every kernel: it may take most of its time);
#  2. graph == eager bits with the switch on: tests/test_replay_gpu.py, tests/test_pool.py (all passed);
#  3. dsv4 bench mini without and with: BENCH_SUMMARY eager_tok_s up, same_stream true, graph_tok_s unchanged;
#  4. eager_host_profile mini without and with: EAGER_HOST wall_ms_per_step, and JITFunction.run gone from the
#     top of the table after the first launches (FastLaunch.launch, arg_spec in its place).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_eagerfast_checks.sh
source benchmarks/gpu_env.sh
export CUDA_VISIBLE_DEVICES=0
timeout 80 python benchmarks/fast_launch_check.py --preset mini --steps 32 --rounds 3 > "$OUT/check_mini.txt" 2>&1
echo "rc=$?" >> "$OUT/check_mini.txt"
DSV4_FAST_LAUNCH=1 timeout 90 python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py \
  > "$OUT/pytest_fast_launch.txt" 2>&1
echo "pytest rc=$? DSV4_FAST_LAUNCH=1" >> "$OUT/pytest_fast_launch.txt"
for fl in 0 1; do
  DSV4_FAST_LAUNCH=$fl timeout 20 python -m dsv4.cli bench --preset mini --device cuda --prime 64 --steps 32 --rows 2 \
    > "$OUT/bench_mini_fast$fl.txt" 2>&1
  echo "rc=$? DSV4_FAST_LAUNCH=$fl" >> "$OUT/bench_mini_fast$fl.txt"
done
for fl in 0 1; do
  DSV4_FAST_LAUNCH=$fl timeout 15 python benchmarks/eager_host_profile.py --preset mini --steps 16 --top 30 \
    > "$OUT/eager_host_fast$fl.txt" 2>&1
  echo "rc=$? DSV4_FAST_LAUNCH=$fl" >> "$OUT/eager_host_fast$fl.txt"
done
