#!/usr/bin/env bash
# Session 8, call 3 (nvidia-h200-x2, <= 9 min): the FP4 expert kernels' two options (kernels/moe.py CONFIG
# gate_up_paired: gate and up in one loop; down_split_experts: the down projection a program per expert; both equal
# bits) and the serving measurement after s8.
#   phase A: GPU 0, the MoE CUDA tests with both options on, replay/pool tests with both on, moe_bench arms;
#            GPU 1, the door/boundary/syncguard tests under the defaults (call 2's timeout cut them);
#   phase B: flash decode, defaults against both options on; serve_bench flash at concurrency 1 and 16 with v3 GEMVs.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s8_call3.sh
source benchmarks/gpu_env.sh
MOE="DSV4_MOE_PAIRED=1 DSV4_MOE_DOWN_SPLIT=1"
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 60 env $MOE python -m pytest -q -p no:cacheprovider tests/test_qgemv.py -k "moe or shared" \
    > "$OUT/pytest_moe_options.txt" 2>&1; echo "pytest rc=$? $MOE" >> "$OUT/pytest_moe_options.txt"
  timeout 130 env $MOE python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py \
    >> "$OUT/pytest_moe_options.txt" 2>&1; echo "pytest rc=$? $MOE replay pool" >> "$OUT/pytest_moe_options.txt"
  timeout 100 python benchmarks/moe_bench.py --tokens 1,16 \
    --arms '^(base|split4|paired|paired_split4|paired_n8|down_split|down_split_n8|paired_down_split|paired_split4_down_split|paired_n8_down_split_n8)$' \
    > "$OUT/moe_bench.txt" 2>&1; echo "rc=$?" >> "$OUT/moe_bench.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 200 python -m pytest -q -p no:cacheprovider tests/test_door_kernel.py tests/test_hc_boundary.py \
    tests/test_syncguard.py > "$OUT/pytest_door_sync.txt" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_door_sync.txt"
) &
wait
for arm in "" "$MOE"; do
  name=$(echo "${arm:-default}" | tr ' =' '_-')
  timeout 70 env $arm python -m dsv4.cli bench --preset flash --device cuda --ranks 2 --prime 64 --steps 32 \
    --rows 2 > "$OUT/bench_flash_$name.txt" 2>&1; echo "rc=$? $arm" >> "$OUT/bench_flash_$name.txt"
done
timeout 110 env $MOE python benchmarks/serve_bench.py --preset flash --device cuda --ranks 2 --concurrency 1,16 \
  --prompt-tokens 64 --max-tokens 64 --level-timeout 20 --gemv v3 > "$OUT/serve_flash_v3.txt" 2>&1
echo "serve_bench rc=$? --gemv v3 $MOE" >> "$OUT/serve_flash_v3.txt"
