#!/usr/bin/env bash
# Branch s8 = main + moetc + topk + doorfuse + qkvfuse (session 7's CPU-tested branches, each behind its switch) on
# nvidia-h200-x2, in two calls (each <= 9 min):
#   part 1: each switch's CUDA tests, then graph == eager / pooled == solo with all four on, beside the kernel benches;
#   part 2: flash decode (nodes, tok/s) default against each switch and all on; the pooled 16-row step with v3 and
#           DSV4_MOE_TC 0 / 1; the gate on mini, 2 ranks, --batch 4 with all on (refusal cells in the graph).
# Switches: DSV4_MOE_TC=1 (moetc), DSV4_KERNELS=triton (topk: kernels/topk.py GPU_CHECKED False),
# DSV4_DOOR_IN_PLACE=1 (doorfuse), DSV4_FUSE_QKV=1 (qkvfuse).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s8_checks.sh 1|2
source benchmarks/gpu_env.sh
ALL="DSV4_KERNELS=triton DSV4_MOE_TC=1 DSV4_DOOR_IN_PLACE=1 DSV4_FUSE_QKV=1"
case "${1:?part 1 or 2}" in
1)
  (
    export CUDA_VISIBLE_DEVICES=0 DSV4_KERNELS=triton
    timeout 100 python -m pytest -q -p no:cacheprovider tests/test_topk_kernel.py tests/test_compressor_kernel.py \
      > "$OUT/pytest_topk.txt" 2>&1; echo "pytest rc=$? topk" >> "$OUT/pytest_topk.txt"
    DSV4_MOE_TC=1 timeout 120 python -m pytest -q -p no:cacheprovider tests/test_moe_tc.py tests/test_qgemv.py \
      -k "tc or moe" > "$OUT/pytest_moetc.txt" 2>&1; echo "pytest rc=$? DSV4_MOE_TC=1" >> "$OUT/pytest_moetc.txt"
  ) &
  (
    export CUDA_VISIBLE_DEVICES=1 DSV4_KERNELS=triton
    DSV4_DOOR_IN_PLACE=1 timeout 110 python -m pytest -q -p no:cacheprovider tests/test_door_kernel.py \
      tests/test_hc_boundary.py > "$OUT/pytest_door.txt" 2>&1; echo "pytest rc=$? DSV4_DOOR_IN_PLACE=1" >> "$OUT/pytest_door.txt"
    DSV4_FUSE_QKV=1 timeout 110 python -m pytest -q -p no:cacheprovider tests/test_qkvfuse.py tests/test_normrope.py \
      > "$OUT/pytest_qkv.txt" 2>&1; echo "pytest rc=$? DSV4_FUSE_QKV=1" >> "$OUT/pytest_qkv.txt"
  ) &
  wait
  (
    export CUDA_VISIBLE_DEVICES=0
    timeout 200 env $ALL python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py \
      > "$OUT/pytest_replay_pool_all.txt" 2>&1; echo "pytest rc=$? $ALL" >> "$OUT/pytest_replay_pool_all.txt"
  ) &
  (
    export CUDA_VISIBLE_DEVICES=1
    timeout 90 python benchmarks/topk_bench.py > "$OUT/topk_bench.txt" 2>&1; echo "rc=$?" >> "$OUT/topk_bench.txt"
    timeout 110 python benchmarks/moe_bench.py --tokens 1,16 --arms '^(base|split4|tc.*)$' > "$OUT/moe_bench_tc.txt" 2>&1
    echo "rc=$?" >> "$OUT/moe_bench_tc.txt"
    timeout 80 python benchmarks/eager_host_profile.py --preset mini --steps 32 > "$OUT/eager_host_mini.txt" 2>&1
    echo "rc=$?" >> "$OUT/eager_host_mini.txt"
  ) &
  wait
  ;;
2)
  for arm in "" "DSV4_KERNELS=triton" "DSV4_MOE_TC=1" "DSV4_DOOR_IN_PLACE=1" "DSV4_FUSE_QKV=1" "$ALL"; do
    name=$(echo "${arm:-default}" | tr ' =' '_-')
    timeout 75 env $arm python -m dsv4.cli bench --preset flash --device cuda --ranks 2 --prime 64 --steps 32 \
      --rows 2 > "$OUT/bench_flash_$name.txt" 2>&1; echo "rc=$? $arm" >> "$OUT/bench_flash_$name.txt"
  done
  timeout 100 env $ALL python -m dsv4.cli gate --preset mini --device cuda --ranks 2 --prime 64 --output 64 --batch 4 \
    --out "$OUT/gate_mini_all.txt" > "$OUT/gate_mini_stdout.txt" 2>&1; echo "gate rc=$?" >> "$OUT/gate_mini_stdout.txt"
  ;;
esac
