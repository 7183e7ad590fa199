#!/usr/bin/env bash
# Session 9 call 4 (nvidia-h200-x2, <= 8.5 min): branch s9f = main + xproj + pf + fuse2, every new switch off by default:
#   DSV4_FUSE_XPROJ=1 (a compressed layer's bf16 x projections in one GEMV), DSV4_BOUNDARY_ONE_PASS=1 and
#   DSV4_BOUNDARY_WARP_MAPS=1 (the mHC boundary's finish), DSV4_ATTN_FUSED_COMBINE=1 (the attention's combine in the
#   split launch), DSV4_MOE_PREFETCH=1 (the paired FP4 loop's next tile loaded early).
#   phase 1 (<= 170 s): GPU 0 the switches' kernel tests; GPU 1 replay/pool/MoE-option tests with all on, moe_bench.
#   phase 2: flash decode, 2 ranks: defaults, all on, then each family alone.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s9_call4.sh
source benchmarks/gpu_env.sh
ALL="DSV4_FUSE_XPROJ=1 DSV4_BOUNDARY_ONE_PASS=1 DSV4_BOUNDARY_WARP_MAPS=1 DSV4_ATTN_FUSED_COMBINE=1 DSV4_MOE_PREFETCH=1"
(
  export CUDA_VISIBLE_DEVICES=0
  env DSV4_KERNELS=triton DSV4_FUSE_XPROJ=1 timeout 100 python -m pytest -q -p no:cacheprovider tests/test_xproj.py \
    tests/test_compressor_kernel.py tests/test_commit_step.py tests/test_kernels.py::test_commit \
    > "$OUT/pytest_xproj.txt" 2>&1; echo "pytest rc=$? DSV4_KERNELS=triton DSV4_FUSE_XPROJ=1" >> "$OUT/pytest_xproj.txt"
  timeout 70 python -m pytest -q -p no:cacheprovider tests/test_hc_boundary.py tests/test_attention_kernel.py \
    > "$OUT/pytest_fuse2.txt" 2>&1; echo "pytest rc=$? (option arms inside)" >> "$OUT/pytest_fuse2.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  env $ALL timeout 110 python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py \
    tests/test_moe_options_gpu.py > "$OUT/pytest_all_on.txt" 2>&1; echo "pytest rc=$? $ALL" >> "$OUT/pytest_all_on.txt"
  timeout 55 python benchmarks/moe_bench.py --tokens 1,16 --arms '^(base|prefetch.*)$' > "$OUT/moe_bench.txt" 2>&1
  echo "rc=$?" >> "$OUT/moe_bench.txt"
) &
wait
bench() {  # name, then the switches
  local name=$1; shift
  env "$@" timeout 55 python -m dsv4.cli bench --preset flash --device cuda --ranks 2 --prime 64 --steps 32 --rows 2 \
    > "$OUT/bench_flash_$name.txt" 2>&1
  echo "bench rc=$? $*" >> "$OUT/bench_flash_$name.txt"
}
bench default DSV4_FUSE_XPROJ=0
bench all $ALL
bench xproj DSV4_FUSE_XPROJ=1
bench boundary DSV4_BOUNDARY_ONE_PASS=1 DSV4_BOUNDARY_WARP_MAPS=1
bench attention DSV4_ATTN_FUSED_COMBINE=1
bench prefetch DSV4_MOE_PREFETCH=1
