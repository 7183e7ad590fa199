#!/usr/bin/env bash
# Session 17 call 4 (nvidia-h200, one GPU, <= 9.5 min): the step's new kernels under their switches
# (DSV4_ROPE_TABLE=1: the rope tables in one launch; DSV4_STEP_BOOKKEEPING=1: Comm's begin / end and the settle in
# one launch each): their CUDA tests (torch's cos / sin bits, the reference's bookkeeping bits), the gate on mini
# (refusal cells in the replayed graph), graph == eager and pooled == solo; mini's kernels a token; mini's solo
# graph off / on / off; then test_moe_options_gpu alone (call 3 ran it beside 7 other workers: out of memory).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s17_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=24
ON="env DSV4_ROPE_TABLE=1 DSV4_STEP_BOOKKEEPING=1"
step 60 "$OUT/pytest_step_kernels.txt" $ON python -m pytest -q -p no:cacheprovider tests/test_rope_table.py \
  tests/test_bookkeeping.py tests/test_kernels.py -k "not sm90"
step 120 "$OUT/gate_mini_batch4_on.txt" $ON python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 \
  --prime 64 --output 64 --out "$OUT/receipts_gate_mini_64_on.txt"
step 110 "$OUT/pytest_replay_pool_on.txt" $ON python -m pytest -q -p no:cacheprovider -n 4 tests/test_replay_gpu.py \
  tests/test_pool.py tests/test_syncguard.py
step 60 "$OUT/kernel_table_mini_on.txt" $ON python benchmarks/kernel_table.py --preset mini --steps 16
step 40 "$OUT/bench_mini_off.txt" python -m dsv4.cli bench --preset mini --device cuda --ranks 1 --prime 64 --steps 64 --rows 3
step 40 "$OUT/bench_mini_on.txt" $ON python -m dsv4.cli bench --preset mini --device cuda --ranks 1 --prime 64 --steps 64 --rows 3
step 40 "$OUT/bench_mini_off2.txt" python -m dsv4.cli bench --preset mini --device cuda --ranks 1 --prime 64 --steps 64 --rows 3
left=$((540 - SECONDS))
if [ $left -gt 30 ]; then
  step $left "$OUT/pytest_moe_options_gpu.txt" python -m pytest -q -p no:cacheprovider tests/test_moe_options_gpu.py
fi
