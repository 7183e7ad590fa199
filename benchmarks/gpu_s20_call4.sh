#!/usr/bin/env bash
# Session 20 call 4 (one H200), the session's final dsv4/ (call 3's tree: the head's own K tiles, the full-token
# graph's sampling rows filled before its capture):
#   1. the gate on mini (graph == eager bit for bit, refusal cells live in the replayed graph, batched == solo);
#   2. the other GPU test files whose paths read the head's logits or the sampler (pool, prefill, cli, kernels,
#      sample / draw kernels, the MoE options), 5 xdist workers;
#   3. where a 64-token prefill's device time goes, kernel by kernel (eager_host_profile --prefill 64).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s20_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=14
step 150 "$OUT/gate_mini_batch4.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 \
  --prime 64 --output 64 --out "$OUT/receipts-gate-mini-64-batch4.txt"
step 320 "$OUT/pytest_gpu_more.txt" python -m pytest -q -p no:cacheprovider -n 5 --dist loadfile -rfE \
  tests/test_pool.py tests/test_prefill.py tests/test_prefill_batch.py tests/test_cli.py tests/test_kernels.py \
  tests/test_sample_kernel.py tests/test_draw_kernel.py tests/test_moe_options_gpu.py tests/test_prefill_limit.py
left=$((545 - SECONDS))
[ $left -gt 40 ] && step $left "$OUT/prefill_kernels_mini.txt" python benchmarks/eager_host_profile.py --preset mini \
  --steps 4 --prefill 64 --top 25
