#!/usr/bin/env bash
# Session 28, call 3 (one H200; branch s28-l2: main + l2_prefetch (off) + the server's GEMVs mma by default):
#   1. the server on mini with its new default (no GEMV switch: the banner must name mma), concurrency 1-32;
#   2. l2_prefetch_bench with larger pieces and fewer fork points (call 2: every arm slower than none);
#   3. tests/test_l2_prefetch.py and tests/test_cli.py;
#   4. the server's default again (the spread between two processes).
# Usage: OUT=dir bash benchmarks/gpu_s28_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
SERVE="python benchmarks/serve_bench.py --preset mini --device cuda --concurrency 1,4,16,32 --prompt-tokens 64 \
  --max-tokens 64 --warmup 1"
step 140 "$OUT/serve_mini_default.txt" $SERVE
step 90 "$OUT/l2_bench_mini.txt" python benchmarks/l2_prefetch_bench.py --preset mini --arms 0 16:131072 \
  32:131072 32:262144 32:131072:attention+moe 16:32768:moe --steps 64 --rounds 4
step 100 "$OUT/pytest_l2_cli.txt" python -m pytest -q -p no:cacheprovider -rfE tests/test_l2_prefetch.py \
  tests/test_cli.py
step 70 "$OUT/serve_mini_default_again.txt" $SERVE
