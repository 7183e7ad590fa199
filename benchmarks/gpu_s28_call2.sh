#!/usr/bin/env bash
# Session 28, call 2 (one H200; branch s28-l2 = main + dsv4.kernels.l2_prefetch, off by default):
#   1. tests/test_l2_prefetch.py (the prefetch keeps every bit, eager and replayed; its launches in the graph; no sync);
#   2. l2_prefetch_bench: mini's solo decode (graph and pipelined) with budgets 0 / 16 / 32 / 48 MB a fork point and
#      32 MB in 32 KB pieces, one process, ABBA rounds, the copy bandwidth in the same run;
#   3. the kernel table of mini's graph step with 32 MB (which kernels the prefetch speeds);
#   4. the server on mini at concurrency 1 / 4 / 16 / 32, GEMVs v3 (its default) then mma, in one call (IDENTITY).
# Usage: OUT=dir bash benchmarks/gpu_s28_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 100 "$OUT/pytest_l2.txt" python -m pytest -q -p no:cacheprovider -rfE tests/test_l2_prefetch.py
step 100 "$OUT/l2_bench_mini.txt" python benchmarks/l2_prefetch_bench.py --preset mini --arms 0 16 32 48 32:32768 \
  --steps 64 --rounds 4
step 50 "$OUT/kernel_table_mini_l2.txt" env DSV4_L2_PREFETCH=32 python benchmarks/kernel_table.py --preset mini \
  --device cuda --steps 16 --top 45
SERVE="python benchmarks/serve_bench.py --preset mini --device cuda --concurrency 1,4,16,32 --prompt-tokens 64 \
  --max-tokens 64 --warmup 1"
step 140 "$OUT/serve_mini_v3.txt" env DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 $SERVE
step 90 "$OUT/serve_mini_mma.txt" env DSV4_QGEMV=mma DSV4_DENSE_GEMV=v3 $SERVE
