#!/usr/bin/env bash
# Session 11 call 2 (nvidia-h200, one GPU, <= 9 min), branch s11 = main + pdlx (DSV4_PDL's early weight fetch in the
# mHC boundary and the router; off by default). benchmarks/gpu_pdlx.sh's steps, plus main's tree (_base, carried
# untracked) as the A arm of the boundary bench and of mini: pdlx also changes the default path's boundary (its
# hc_fn slice held in registers: 80 -> 114 registers with the switch off).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s11_call2.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=14
step 90 "$OUT/pytest_pdl_bits.txt" python -m pytest -q -p no:cacheprovider tests/test_kernels.py -k pdl_keeps_the_bits
boundary() {  # boundary NAME DIR PDL
  step 40 "$OUT/hc_boundary_$1.txt" env -C "$2" PYTHONPATH="$PWD/$2" DSV4_PDL=$3 python benchmarks/hc_boundary_bench.py \
    --rows 1 --arms 'fused_default$'
}
boundary base_pdl0 _base 0
boundary s11_pdl0 . 0
boundary s11_pdl1 . 1
for pdl in 0 1; do
  step 30 "$OUT/route_bench_pdl$pdl.txt" env DSV4_PDL=$pdl python benchmarks/route_bench.py --rows 1
done
mini() {  # mini NAME DIR PDL
  step 55 "$OUT/bench_mini_$1.txt" env -C "$2" PYTHONPATH="$PWD/$2" DSV4_PDL=$3 python -m dsv4.cli bench --preset mini \
    --device cuda --prime 64 --steps 128 --rows 3
}
mini a_base_pdl0 _base 0
mini b_s11_pdl0 . 0
mini c_s11_pdl1 . 1
mini d_base_pdl1 _base 1
step 60 "$OUT/pytest_pdl.txt" env DSV4_PDL=1 python -m pytest -q -p no:cacheprovider tests/test_hc_boundary.py \
  tests/test_route_kernel.py -k "plain or not (one_pass or warp_maps or both)"
