#!/usr/bin/env bash
# For session 43 (written in session 42 with no device time left; main's defaults are session 42 call 6's CUDA code):
#   1. replay CONFIG fetch=copy (built in session 42, never GPU-run): mapped I/O's token copied by a memcpy node
#      instead of the fetch kernel (4.5 us of the step in call 9's kernel table): its GPU test, then decode_ab;
#   2. the bench and its profile on main's defaults (session 42 call 7: graph 1,009.1 / 1,021.0, pipelined ~1,028).
# Usage: OUT=dir bash benchmarks/gpu_s43_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 150 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile -rfE -p pytest_failures \
  tests/test_replay_gpu.py tests/test_bookkeeping.py -k "mapped or host_tokens or fetch"
step 120 "$OUT/decode_ab.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 6 \
  --arm copy=replay.fetch=copy
step 80 "$OUT/bench.txt" python -m dsv4.cli bench --preset mini --device cuda
step 90 "$OUT/kernel_table.txt" python benchmarks/kernel_table.py --preset mini --steps 16 --top 60
