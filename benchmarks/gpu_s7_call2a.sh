#!/usr/bin/env bash
# Session 7, call 2a (one H200: the x2 kind was not lent), <= 6.5 min: gpu_s7_call2.sh's single-GPU parts, in turn —
# the draw kernel and the sampler's tests on CUDA, test_replay_gpu under the defaults, qgemv_bench and dense_bench
# at 1 and 16 rows (v2 against v3's arms), then the gate on mini, one rank, --batch 4 with v3 on.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s7_call2a.sh
source benchmarks/gpu_env.sh
V3="DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3"
timeout 60 python -m pytest -q -p no:cacheprovider tests/test_draw_kernel.py tests/test_sampler.py \
  > "$OUT/pytest_draw_sampler.txt" 2>&1
echo "pytest rc=$? draw+sampler (auto)" >> "$OUT/pytest_draw_sampler.txt"
timeout 90 python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py > "$OUT/pytest_replay_auto.txt" 2>&1
echo "pytest rc=$? replay (auto)" >> "$OUT/pytest_replay_auto.txt"
timeout 70 python benchmarks/qgemv_bench.py --rows 1,16 \
  --arms '^(v2_rows1|v2_rows8|v3_default|v3_n16|v3_n64_k128|v3_programs528|v3_nosplit)$' > "$OUT/qgemv_rows.txt" 2>&1
echo "rc=$?" >> "$OUT/qgemv_rows.txt"
timeout 60 python benchmarks/dense_bench.py --rows 1,16 \
  --arms '^(cublas|kernel_default|kernel_v3|kernel_v3_n16_k512|kernel_v3_n64_k128|kernel_v3_programs528)$' \
  > "$OUT/dense_rows.txt" 2>&1
echo "rc=$?" >> "$OUT/dense_rows.txt"
timeout 90 env $V3 python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --prime 128 --output 128 \
  --batch 4 --out "$OUT/gate_mini_128_batch4_v3_1rank.txt" > "$OUT/gate_mini_stdout.txt" 2>&1
echo "gate rc=$?" >> "$OUT/gate_mini_stdout.txt"
