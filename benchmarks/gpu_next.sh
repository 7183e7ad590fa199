#!/usr/bin/env bash
# The next call on one H200 (<= 6.5 min), main's tree: the server's GEMV family, v3 (its default) against mma
# (session 27: mma's tests, gate and server identity passed; its server figures and v3's came from two calls), in one
# call. The GPU suite whole (~320 s; session 27 ran its defaults' files only in part) needs a call of its own:
# `source benchmarks/gpu_env.sh; gpu_suite 345 "$OUT/pytest_gpu_suite.txt"`.
#   1. a throwaway server run (a fresh machine's first server compiles for 70-100 s; session 27 lost two levels so);
#   2. the server on mini at concurrency 1 / 4 / 16 / 32 with v3, then mma, then v3 again (IDENTITY in each);
# Branch s27-mma16 (programs of 16 columns, never run on a GPU) takes the same script plus its test:
#   pytest tests/test_qgemv_mma.py -k sixteen; DSV4_QGEMV_MMA_COLUMNS=16 for the mma server.
# Usage: OUT=dir bash benchmarks/gpu_next.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
SERVE="python benchmarks/serve_bench.py --preset mini --device cuda --prompt-tokens 64 --max-tokens 64 --warmup 1"
step 150 "$OUT/serve_warm.txt" env DSV4_QGEMV=mma DSV4_DENSE_GEMV=v3 $SERVE --concurrency 1
step 70 "$OUT/serve_mini_v3.txt" $SERVE --concurrency 1,4,16,32
step 70 "$OUT/serve_mini_mma.txt" env DSV4_QGEMV=mma DSV4_DENSE_GEMV=v3 $SERVE --concurrency 1,4,16,32
step 70 "$OUT/serve_mini_v3_again.txt" $SERVE --concurrency 1,4,16,32
