#!/usr/bin/env bash
# Issue 10, branch pdlx (nvidia-h200, one GPU, ~4 min; every step under its own timeout, 7.5 min at worst): DSV4_PDL's
# early weight fetch extended to the mHC boundary (every program loads its hc_fn slice, base, scale and norm weight
# before griddepcontrol.wait) and the router (a top-k layer's bias before the wait); both launched with launch_pdl
# under DSV4_PDL=1 (off by default). In order of importance, so that a cut leaves the first steps' records:
#   1. test_kernels' test_pdl_keeps_the_bits_of_the_boundary_and_the_router: DSV4_PDL=0 and =1 in two processes give
#      equal sha256 over a chain of boundaries and the gate's GEMV then the router, eager and replayed;
#   2. hc_boundary_bench's fused_default arm (mid and first boundary, 1 row: a graph of back-to-back boundaries
#      rotating over hc_fn copies) and route_bench (the gate's GEMV; the GEMV then the router; the router alone),
#      each with DSV4_PDL=0 and =1 (separate processes; a record's digest must agree between the two);
#   3. mini decode, 1 rank, 3 rows of 128: DSV4_PDL=0, =1, =0 (ABA: the machine drifts);
#   4. the converted kernels' CUDA tests with DSV4_PDL=1 (test_hc_boundary at the default finish options, the
#      model's decode through the boundary among them; test_route_kernel).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_pdlx.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=20
stamp() { echo "$1 $(date +%s)" >> "$OUT/times.txt"; }
stamp start
timeout 90 python -m pytest -q -p no:cacheprovider tests/test_kernels.py -k pdl_keeps_the_bits \
  > "$OUT/pytest_pdl_bits.txt" 2>&1; echo "pytest rc=$?" >> "$OUT/pytest_pdl_bits.txt"
stamp bits
for pdl in 0 1; do
  DSV4_PDL=$pdl timeout 40 python benchmarks/hc_boundary_bench.py --rows 1 --arms 'fused_default$' \
    > "$OUT/hc_boundary_bench_pdl$pdl.txt" 2>&1; echo "rc=$? DSV4_PDL=$pdl" >> "$OUT/hc_boundary_bench_pdl$pdl.txt"
  DSV4_PDL=$pdl timeout 30 python benchmarks/route_bench.py --rows 1 \
    > "$OUT/route_bench_pdl$pdl.txt" 2>&1; echo "rc=$? DSV4_PDL=$pdl" >> "$OUT/route_bench_pdl$pdl.txt"
done
stamp benches
for run in a b c; do
  pdl=$([ $run = b ] && echo 1 || echo 0)
  DSV4_PDL=$pdl timeout 50 python -m dsv4.cli bench --preset mini --device cuda --prime 64 --steps 128 --rows 3 \
    > "$OUT/bench_mini_${run}_pdl$pdl.txt" 2>&1
  echo "rc=$? DSV4_PDL=$pdl" >> "$OUT/bench_mini_${run}_pdl$pdl.txt"
done
stamp mini
DSV4_PDL=1 timeout 60 python -m pytest -q -p no:cacheprovider tests/test_hc_boundary.py tests/test_route_kernel.py \
  -k "plain or not (one_pass or warp_maps or both)" > "$OUT/pytest_pdl.txt" 2>&1
echo "pytest rc=$? DSV4_PDL=1" >> "$OUT/pytest_pdl.txt"
stamp tests
