#!/usr/bin/env bash
# Branch fuse2 on 2 x H200 (nvidia-h200-x2), <= 8 minutes: two decode launches' worth of latency cut, all off by default.
#   DSV4_BOUNDARY_ONE_PASS=1   kernels/hc_boundary.py CONFIG one_pass_finish: the finish collapses and norms the row
#                              in registers (one pass, the row loaded before the maps)
#   DSV4_BOUNDARY_WARP_MAPS=1  CONFIG warp_maps: the maps' [hc, hc] tiles inside one warp (sm_90 SASS of the finish:
#                              78 -> 11 barriers)
#   DSV4_ATTN_FUSED_COMBINE=1  kernels/attention.py CONFIG fused_combine: the combine inside the split launch (its last
#                              program merges; launches of at most fused_max_splits 8 splits)
# Each may change bits against the defaults (sums in other orders); eager == graph and batched == solo must hold.
#   phase 1, in parallel (<= 220 s):
#     GPU 0: the kernels' CUDA tests (every option arm: test_hc_boundary's `options` fixture, test_attention_kernel's
#            fused tests), then test_replay_gpu + test_pool with all three switches on;
#     GPU 1: hc_boundary_bench (mid and first boundaries, rows 1 and 4: fused_default vs the option arms) and
#            attention_bench (kernel_default vs fused, fused_any, fused_any_t2).
#   phase 2: flash decode, 2 ranks, the switches off, each family on, all on (timeout 60 each): BENCH_SUMMARY tok/s.
#   FUSE2_TABLE=1 adds the flash kernel table with all on (~160 s more: run it as a call of its own).
# Look for: pytest rc=0 everywhere; HC_BOUNDARY fused_one_pass* / fused_warp_maps* us below fused_default's at
#   rows 1 with rows_exact, tickets_zero, streams_equal true (default_bits may be false: max_rel_err ~1e-7 fp32 scale);
#   ATTN fused arms: fused true, deterministic true, max_rel_err like kernel_default's, us_graph below it (sliding,
#   hca_4k: 5-6 splits; csa/hca_128k only in fused_any*: 21 and 37 splits, where one program's merge may lose);
#   bench: graph tok/s up against the off run, `same` tokens across the runs where the bits agree.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_fuse2_checks.sh
source benchmarks/gpu_env.sh
ALL="DSV4_BOUNDARY_ONE_PASS=1 DSV4_BOUNDARY_WARP_MAPS=1 DSV4_ATTN_FUSED_COMBINE=1"
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 120 python -m pytest -q -p no:cacheprovider tests/test_hc_boundary.py tests/test_attention_kernel.py \
    > "$OUT/pytest_kernels.txt" 2>&1
  echo "pytest rc=$? kernels (option arms inside)" >> "$OUT/pytest_kernels.txt"
  env $ALL timeout 100 python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py \
    > "$OUT/pytest_replay_pool_all_on.txt" 2>&1
  echo "pytest rc=$? $ALL" >> "$OUT/pytest_replay_pool_all_on.txt"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 80 python benchmarks/hc_boundary_bench.py --rows 1,4 \
    --arms 'unfused$|fused_default|fused_one_pass|fused_warp_maps' > "$OUT/hc_boundary_bench.txt" 2>&1
  echo "rc=$?" >> "$OUT/hc_boundary_bench.txt"
  timeout 100 python benchmarks/attention_bench.py --configs default,fused,fused_any,fused_any_t2 \
    > "$OUT/attention_bench.txt" 2>&1
  echo "rc=$?" >> "$OUT/attention_bench.txt"
) &
wait
bench() {  # name, then the switches
  local name=$1; shift
  env "$@" timeout 60 python -m dsv4.cli bench --preset flash --device cuda --ranks 2 --prime 64 --steps 32 --rows 2 \
    > "$OUT/bench_flash_$name.txt" 2>&1
  echo "bench rc=$? $*" >> "$OUT/bench_flash_$name.txt"
}
bench off DSV4_BOUNDARY_ONE_PASS=0
bench boundary DSV4_BOUNDARY_ONE_PASS=1 DSV4_BOUNDARY_WARP_MAPS=1
bench attention DSV4_ATTN_FUSED_COMBINE=1
bench all $ALL
if [ "${FUSE2_TABLE:-0}" = 1 ]; then
  env $ALL timeout 170 python benchmarks/kernel_table.py --preset flash --device cuda --ranks 2 \
    > "$OUT/kernel_table_flash_all_on.txt" 2>&1
  echo "kernel_table rc=$? $ALL" >> "$OUT/kernel_table_flash_all_on.txt"
fi
