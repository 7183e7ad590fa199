#!/usr/bin/env bash
# Issue 12, branch v3pdl (nvidia-h200, one GPU, ~4-5 min; every step under its own limit, 9 min at worst): DSV4_PDL's
# early weight fetch extended to the tensor-core GEMVs (qgemv's _qgemv3_kernel on every weight it takes, dense's
# _dense3_kernel on a stored weight: the first K tile loaded before griddepcontrol.wait, launched with launch_pdl
# under DSV4_PDL=1, off by default; the peel runs with the switch off too). In order of importance, so that a cut
# leaves the first steps' records:
#   1. the v3 tests on CUDA with DSV4_PDL=1 and v3 selected (the early tile's bits equal main's v3 kernels, kept in
#      tests/v3_main.py; rows alone == in a batch; against the reference), plus test_kernels' chain (boundaries, the
#      gate's GEMV, now dense v3 launched early, then the router: DSV4_PDL=0 and =1 equal digests, eager and
#      replayed); then the early-tile tests with DSV4_PDL=0 (the peel's bits with the switch off);
#   2. qgemv_bench's batched-step arm v3_default at 1 and 16 rows (one flash layer's FP8 linears, QGEMV_ROWS), with
#      DSV4_PDL=0 and =1 (look for us per layer: PDL=1 under PDL=0 at both rows; rows_exact true);
#   3. mini decode with --gemv v3, 1 rank, 3 rows of 128: DSV4_PDL=0, =1, =0 (ABA: the machine drifts; eager ==
#      graph in each record);
#   4. batch_bench on mini with v3 at 1 and 16 rows, plain and pooled states: DSV4_PDL=0, then =1.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_v3pdl.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
stamp() { echo "$1 $(date +%s)" >> "$OUT/times.txt"; }
V3="DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3"
stamp start
step 150 "$OUT/pytest_v3_pdl1.txt" env DSV4_PDL=1 $V3 python -m pytest -q -p no:cacheprovider tests/test_qgemv.py \
  tests/test_dense_kernel.py tests/test_kernels.py -k "v3 or pdl_keeps_the_bits"
step 60 "$OUT/pytest_v3_pdl0.txt" env DSV4_PDL=0 $V3 python -m pytest -q -p no:cacheprovider tests/test_qgemv.py \
  tests/test_dense_kernel.py -k early_tile
stamp tests
for pdl in 0 1; do
  step 60 "$OUT/qgemv_bench_v3_pdl$pdl.txt" env DSV4_PDL=$pdl python benchmarks/qgemv_bench.py --rows 1,16 \
    --arms 'v3_default$'
done
stamp qgemv_bench
for run in a b c; do
  pdl=$([ $run = b ] && echo 1 || echo 0)
  step 60 "$OUT/bench_mini_v3_${run}_pdl$pdl.txt" env DSV4_PDL=$pdl python -m dsv4.cli bench --preset mini \
    --device cuda --prime 64 --steps 128 --rows 3 --gemv v3
done
stamp mini
for pdl in 0 1; do
  step 100 "$OUT/batch_mini_v3_pdl$pdl.txt" env DSV4_PDL=$pdl $V3 python benchmarks/batch_bench.py mini \
    --sizes 1 16 --steps 32 --rows 2 --pool
done
stamp batch
