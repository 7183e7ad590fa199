#!/usr/bin/env bash
# Session 11's last call if nvidia-h200-x2 is lent (<= 3.5 min), main's final tree: the prefill MoE kernels' and the
# sampler kernel's CUDA tests (see gpu_s11_final1.sh), then flash decode, 2 rows of 64, under the defaults and with
# DSV4_PDL=1 (every weight-streaming GEMV, v2 and v3, the boundary and the router fetch before the wait).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s11_final2.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=14
step 40 "$OUT/pytest_prefill_moe.txt" python -m pytest -q -p no:cacheprovider tests/test_prefill.py \
  -k "prefill_moe_kernel or fp4_expert_kernel"
step 40 "$OUT/pytest_sample_kernel.txt" python -m pytest -q -p no:cacheprovider tests/test_sample_kernel.py \
  tests/test_draw_kernel.py tests/test_sampler.py
for pdl in 0 1; do
  step 75 "$OUT/bench_flash_pdl$pdl.txt" env DSV4_PDL=$pdl python -m dsv4.cli bench --preset flash --device cuda \
    --ranks 2 --prime 64 --steps 64 --rows 2
done
