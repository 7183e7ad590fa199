#!/usr/bin/env bash
# Session 24 call 4 (one H200), main's tree after call 3 (geometry chunks on by default): the figures a next session
# starts from. mini's solo decode with its phases on v2 (the default) and on v3 (the server's GEMVs: how much of
# the concurrency-1 server's 1.35 ms a token against the bench's ~1.18 is v3 at one row, and where), the server at
# concurrency 1 / 4 / 16 / 32, and the FP8 linears of one Flash layer at 1 and 16 rows on v2 and v3's tiles.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s24_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
step 90 "$OUT/bench_mini_v2.txt" python -m dsv4.cli bench --preset mini --prime 64 --steps 64 --rows 3 --profile
step 90 "$OUT/bench_mini_v3.txt" python -m dsv4.cli bench --preset mini --gemv v3 --prime 64 --steps 64 --rows 3 \
  --profile
step 150 "$OUT/serve_mini.txt" python benchmarks/serve_bench.py --preset mini --device cuda --concurrency 1,4,16,32 \
  --prompt-tokens 64 --max-tokens 64 --warmup 1
step 90 "$OUT/qgemv_rows.txt" python benchmarks/qgemv_bench.py --rows 1,16 --arms 'v3|v2_rows1$'
