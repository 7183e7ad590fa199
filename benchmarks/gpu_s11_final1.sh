#!/usr/bin/env bash
# Session 11's last call on one H200 (<= 4 min), main's final tree: the prefill MoE kernels' CUDA tests (v3pdl split
# their FP4 tile into loads and decode, shared with v3), the replay and pool tests under the defaults, mini decode.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s11_final1.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
step 60 "$OUT/pytest_prefill_moe.txt" python -m pytest -q -p no:cacheprovider tests/test_prefill.py \
  -k "prefill_moe_kernel or fp4_expert_kernel"
step 110 "$OUT/pytest_replay_pool.txt" python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py
step 55 "$OUT/bench_mini.txt" python -m dsv4.cli bench --preset mini --device cuda --prime 64 --steps 128 --rows 3
