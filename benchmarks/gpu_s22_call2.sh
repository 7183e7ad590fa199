#!/usr/bin/env bash
# Session 22 call 2 (one H200, <= 9.5 min): moe_tc's new defaults (16 x 128 tiles for short chunks, order "auto":
# planes_one at 16 rows a tile, the planes' bits) and the server's warm-up of the long chunks' tiles.
#   1. the tests on the GPU (moe_tc, prefill, prefill batch: the bits alone == batch, planes_one == planes);
#   2. prefill_moe_bench: the new default (tc) against the old one (tc_n64_planes) and planes at 16 x 128;
#   3. mini's prefill at 64 to 4,096 tokens (logits_sha must equal call 1's: the same bits);
#   4. the 16 x 63 grouped wave (a concurrency-16 server's first prefill) with its kernel profile;
#   5. the server on 1,024-token prompts from a cold Triton cache, DSV4_LOG_COMPILES=1: FIRST's time to first
#      token and no compile after the server answered.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s22_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 110 "$OUT/pytest_tc.txt" python -m pytest -q -p no:cacheprovider -n 3 --dist loadfile -rfE \
  tests/test_moe_tc.py tests/test_prefill_batch.py tests/test_prefill.py
step 50 "$OUT/prefill_moe_mini.txt" python benchmarks/prefill_moe_bench.py --n-local 256 \
  --tokens 64,128,512 --arms "^tc$|tc_n64_planes|tc_planes$"
step 30 "$OUT/prefill_moe_flash_rank.txt" python benchmarks/prefill_moe_bench.py --n-local 128 \
  --tokens 128,512 --arms "^tc$|tc_n64_planes|tc_planes$"
step 110 "$OUT/prefill_mini.txt" python benchmarks/prefill_bench.py mini --sizes 64 128 512 1024 4096 \
  --runs 3 --eager-steps 0 --graph-steps 0 --no-hf
step 60 "$OUT/prefill_batch_mini.txt" python benchmarks/prefill_batch_bench.py mini --states 16 --tokens 63 \
  --runs 3 --profile 25
step 150 "$OUT/serve_mini_1024_cold.txt" env TRITON_CACHE_DIR=/tmp/tc_cold DSV4_LOG_COMPILES=1 \
  python benchmarks/serve_bench.py --preset mini --device cuda --concurrency 1,4 --prompt-tokens 1024 \
  --max-tokens 16
