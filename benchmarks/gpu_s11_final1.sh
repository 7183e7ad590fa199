#!/usr/bin/env bash
# Session 11's last call on one H200 (<= 3 min), main's final tree: the prefill MoE kernels' CUDA tests (v3pdl split
# their FP4 tile into loads and decode, shared with v3), the sampler's CUDA tests (a NaN row's argmax guarded; the torch path row by row, against the kernel),
# the replay and pool tests under the defaults.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s11_final1.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=8
step 45 "$OUT/pytest_prefill_moe.txt" python -m pytest -q -p no:cacheprovider tests/test_prefill.py \
  -k "prefill_moe_kernel or fp4_expert_kernel"
step 45 "$OUT/pytest_sample_kernel.txt" python -m pytest -q -p no:cacheprovider tests/test_sample_kernel.py \
  tests/test_draw_kernel.py tests/test_sampler.py
step 100 "$OUT/pytest_replay_pool.txt" python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py
