#!/usr/bin/env bash
# Session 42 call 10: replay CONFIG early_token (DSV4_EARLY_TOKEN=1, off): the first mHC boundary reads the mapped
# token from host memory before its PDL wait and stores it into the state's input (no fetch launch). Its GPU tests
# (graph == eager under it, mapped == not, the boundary's and the eager step's host-token cases), then decode_ab.
# Usage: OUT=dir bash benchmarks/gpu_s42_call10.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
DSV4_EARLY_TOKEN=1 step 150 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -n 3 --dist loadfile -rfE \
  -p pytest_failures tests/test_replay_gpu.py tests/test_hc_boundary.py tests/test_bookkeeping.py \
  -k "mapped or bit_identical or gathers or host_tokens or fetch"
step 110 "$OUT/decode_ab.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm early=replay.early_token=1
