#!/usr/bin/env bash
# Session 11 call 5 (nvidia-h200, one GPU, <= 7 min), branch s11c5 = main (the sampler's inputs made contiguous; the
# server precaptures each bucket's restricted step too) + v3pdl (the v3 GEMVs' first weight tile before the PDL wait).
#   1. v3's CUDA tests with DSV4_PDL=1 (and the early tile's bits with =0): the peel keeps main's bits;
#   2. qgemv_bench, one flash layer's FP8 linears on v3 at 1 and 16 rows, PDL 0 and 1;
#   3. mini decode with --gemv v3, PDL 0 and 1 (beside session 11's v2 figures);
#   4. serve_bench on mini with --gemv v3 at concurrency 1 and 16 (main's new server code: both graphs a bucket
#      precaptured; a server of many users on the tensor-core GEMVs).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s11_call5.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
V3="DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3"
step 120 "$OUT/pytest_v3_pdl1.txt" env DSV4_PDL=1 $V3 python -m pytest -q -p no:cacheprovider tests/test_qgemv.py \
  tests/test_dense_kernel.py tests/test_kernels.py -k "v3 or pdl_keeps_the_bits"
step 45 "$OUT/pytest_v3_pdl0.txt" env DSV4_PDL=0 $V3 python -m pytest -q -p no:cacheprovider tests/test_qgemv.py \
  tests/test_dense_kernel.py -k early_tile
for pdl in 0 1; do
  step 50 "$OUT/qgemv_bench_v3_pdl$pdl.txt" env DSV4_PDL=$pdl python benchmarks/qgemv_bench.py --rows 1,16 \
    --arms 'v3_default$'
done
for pdl in 0 1; do
  step 50 "$OUT/bench_mini_v3_pdl$pdl.txt" env DSV4_PDL=$pdl python -m dsv4.cli bench --preset mini \
    --device cuda --prime 64 --steps 128 --rows 3 --gemv v3
done
step 110 "$OUT/serve_mini_v3.txt" python benchmarks/serve_bench.py --preset mini --device cuda --gemv v3 \
  --concurrency 1,16 --prompt-tokens 64 --max-tokens 64
