#!/usr/bin/env bash
# Session 30, call 4 (one H200, <= 7 min):
#   1. tests/test_prefill_graphs.py whole (the pool made anew when no graph is alive in it: call 3's tiny failure);
#   2. tests/test_qgemv_mma.py alone (the review mend's second file; calls 1-2 cut before it was seen whole);
#   3. the server on mini with DSV4_PREFILL_GRAPHS=1 and without, concurrency 1 and 4 (a throwaway server first; each
#      level's untimed warm-up pass gives every slot its eager chunk and its capture), IDENTITY.
# Usage: OUT=dir bash benchmarks/gpu_s30_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 130 "$OUT/pytest_prefill_graphs.txt" python -m pytest -q -p no:cacheprovider --tb=short -rfE \
  tests/test_prefill_graphs.py
step 60 "$OUT/pytest_qgemv_mma.txt" python -m pytest -q -p no:cacheprovider -rfE tests/test_qgemv_mma.py
SERVE="python benchmarks/serve_bench.py --preset mini --device cuda --prompt-tokens 64 --max-tokens 64 --warmup 1"
step 60 "$OUT/serve_warm.txt" $SERVE --concurrency 1
step 75 "$OUT/serve_mini_pgraphs.txt" env DSV4_PREFILL_GRAPHS=1 $SERVE --concurrency 1,4
step 75 "$OUT/serve_mini_eager.txt" $SERVE --concurrency 1,4
