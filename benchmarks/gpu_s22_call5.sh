#!/usr/bin/env bash
# Session 22 call 5 (one H200): call 3's shared expert on the v3 tiles, its activation over the whole chunk in one
# elementwise pass (call 3 ran it row by row: 0.43 s a 16 x 63 wave). The bits must be call 3's (digest
# 9515d3c5247f6be2 for the wave, logits 637b29bb8ce9 / 2b21a90ea545 for 64 / 128 tokens): call 3's gate holds.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s22_call5.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
step 100 "$OUT/pytest_shared.txt" python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile -rfE \
  tests/test_prefill_batch.py tests/test_prefill.py
step 50 "$OUT/prefill_batch_on.txt" python benchmarks/prefill_batch_bench.py mini --states 16 --tokens 63 \
  --runs 3 --profile 12
step 40 "$OUT/prefill_batch_off.txt" env DSV4_MOE_SHARED_PREFILL_TILES=0 python benchmarks/prefill_batch_bench.py \
  mini --states 16 --tokens 63 --runs 3
step 45 "$OUT/prefill_mini_on.txt" python benchmarks/prefill_bench.py mini --sizes 64 128 512 --runs 3 \
  --eager-steps 0 --graph-steps 0 --no-hf
