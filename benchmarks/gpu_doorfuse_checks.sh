#!/usr/bin/env bash
# Issue 10 (branch doorfuse) on 2 x H200 (nvidia-h200-x2), <= 6 minutes: the all-reduce door without its pack launch.
# DSV4_DOOR_IN_PLACE=1 (kernels/door.py CONFIG in_place, off by default): the fused mHC boundary kernel does the next
# door's bookkeeping (flag, census, verdict) and wo_b's GEMV / the routed down kernel write the partial sums straight
# into the door's payload: one launch fewer per door (86 a flash token).
#   phase 1, in parallel (<= 150 s):
#     GPU 0: the door and boundary tests on CUDA (door opened by the boundary kernel == the reference door; tiny and
#            tiny_fp8 bytes equal with the switch on and off, a refusal included: DSV4_SLOW=1 runs the fp8 one), and
#            beside them test_replay_gpu + test_pool with DSV4_DOOR_IN_PLACE=1 (graph == eager, batched == solo);
#     GPU 1: test_replay_gpu + test_pool with it off (the control).
#   phase 2, both GPUs: flash decode with the switch off, then on: tok/s and the graph's kernel nodes per token per rank
#     (1,412 at session 7 with it off; expected 1,326 with it on), then the gate on mini with it on (eager == graph
#     per rank, --batch 4, and its refusal cells firing inside the replayed graph).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_doorfuse_checks.sh
source benchmarks/gpu_env.sh
(
  export CUDA_VISIBLE_DEVICES=0
  DSV4_DOOR_IN_PLACE=1 DSV4_SLOW=1 timeout 120 python -m pytest -q -p no:cacheprovider tests/test_door_kernel.py \
    tests/test_hc_boundary.py > "$OUT/pytest_door_boundary_on.txt" 2>&1
  echo "pytest rc=$? door+boundary DSV4_DOOR_IN_PLACE=1" >> "$OUT/pytest_door_boundary_on.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=0 DSV4_DOOR_IN_PLACE=1
  timeout 150 python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py \
    > "$OUT/pytest_replay_pool_on.txt" 2>&1
  echo "pytest rc=$? DSV4_DOOR_IN_PLACE=1" >> "$OUT/pytest_replay_pool_on.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1 DSV4_DOOR_IN_PLACE=0
  timeout 150 python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py \
    > "$OUT/pytest_replay_pool_off.txt" 2>&1
  echo "pytest rc=$? DSV4_DOOR_IN_PLACE=0" >> "$OUT/pytest_replay_pool_off.txt"
) &
wait
for on in 0 1; do
  DSV4_DOOR_IN_PLACE=$on timeout 65 python -m dsv4.cli bench --preset flash --device cuda --ranks 2 --prime 64 \
    --steps 32 --rows 2 > "$OUT/bench_flash_door_in_place_$on.txt" 2>&1
  echo "bench rc=$? DSV4_DOOR_IN_PLACE=$on" >> "$OUT/bench_flash_door_in_place_$on.txt"
done
DSV4_DOOR_IN_PLACE=1 timeout 75 python -m dsv4.cli gate --preset mini --device cuda --ranks 2 --prime 64 --output 64 \
  --batch 4 --out "$OUT/receipts-gate-mini-64-batch4-doorfuse-2xh200.txt" > "$OUT/gate_mini_door_in_place.txt" 2>&1
echo "gate rc=$? DSV4_DOOR_IN_PLACE=1" >> "$OUT/gate_mini_door_in_place.txt"
