#!/usr/bin/env bash
# Branch s8 = main + topk + doorfuse + qkvfuse (moetc reverted: slower than the plain kernels at 16 rows, call 1) on
# nvidia-h200-x2. Part 1 (session 8 call 1) ran each switch's CUDA tests and the kernel benches. Part 2 runs the
# final form, the three on by default (kernels/topk.py GPU_CHECKED True, up to DSV4_TOPK_MAX_N 4096 keys;
# DSV4_DOOR_IN_PLACE and DSV4_FUSE_QKV default 1): their CUDA tests, replay and pool tests, flash decode against
# topk or the door turned off and all three off (main's behaviour), the gate on mini, 2 ranks, --batch 4.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s8_checks.sh 2
source benchmarks/gpu_env.sh
OFF="DSV4_TOPK_MAX_N=0 DSV4_DOOR_IN_PLACE=0 DSV4_FUSE_QKV=0"
case "${1:?part 2}" in
2)
  (
    export CUDA_VISIBLE_DEVICES=0
    timeout 150 python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py \
      tests/test_topk_kernel.py tests/test_compressor_kernel.py > "$OUT/pytest_replay_pool_topk.txt" 2>&1
    echo "pytest rc=$?" >> "$OUT/pytest_replay_pool_topk.txt"
    timeout 40 python benchmarks/pool_launch_diag.py > "$OUT/pool_diag.txt" 2>&1; echo "rc=$?" >> "$OUT/pool_diag.txt"
    # why the FP4 expert kernels run at ~20-40 % of the bandwidth: hardware counters, if this runtime has them
    for T in 1 16; do
      timeout 50 ncu --clock-control none --kernel-name regex:'_gate_up_kernel|_down_kernel' --launch-skip 10 \
        --launch-count 2 --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
        --section MemoryWorkloadAnalysis python benchmarks/moe_bench.py --tokens $T --arms '^base$' --calls 8 \
        > "$OUT/ncu_moe_T$T.txt" 2>&1; echo "rc=$?" >> "$OUT/ncu_moe_T$T.txt"
    done
  ) &
  (
    export CUDA_VISIBLE_DEVICES=1
    timeout 150 python -m pytest -q -p no:cacheprovider tests/test_door_kernel.py tests/test_hc_boundary.py \
      tests/test_qkvfuse.py tests/test_normrope.py tests/test_syncguard.py > "$OUT/pytest_door_qkv.txt" 2>&1
    echo "pytest rc=$?" >> "$OUT/pytest_door_qkv.txt"
  ) &
  wait
  for arm in "" "DSV4_TOPK_MAX_N=0" "DSV4_DOOR_IN_PLACE=0" "$OFF"; do
    name=$(echo "${arm:-default}" | tr ' =' '_-')
    timeout 70 env $arm python -m dsv4.cli bench --preset flash --device cuda --ranks 2 --prime 64 --steps 32 \
      --rows 2 > "$OUT/bench_flash_$name.txt" 2>&1; echo "rc=$? $arm" >> "$OUT/bench_flash_$name.txt"
  done
  timeout 100 python -m dsv4.cli gate --preset mini --device cuda --ranks 2 --prime 64 --output 64 --batch 4 \
    --out "$OUT/gate_mini.txt" > "$OUT/gate_mini_stdout.txt" 2>&1; echo "gate rc=$?" >> "$OUT/gate_mini_stdout.txt"
  ;;
esac
