#!/usr/bin/env bash
# Session 43, call 1 (one H200: no two-GPU machine lent):
#   1. Flash's rank 0 of 2 alone on this GPU (benchmarks/rank_proxy.py, new): its decode (eager, graph, pipelined),
#      its graph's kernel nodes, the phases, bytes and roofline of a Flash rank, then its kernel table;
#   2. replay CONFIG fetch=copy (built in session 42, never GPU-run): its GPU test, then decode_ab on mini.
# Usage: OUT=dir bash benchmarks/gpu_s43_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 200 "$OUT/proxy.txt" python benchmarks/rank_proxy.py --preset flash --world 2 --steps 64 --rows 3 \
  --eager-steps 4 --profile
step 150 "$OUT/proxy_kernels.txt" python benchmarks/kernel_table.py --preset flash --proxy-world 2 --steps 4 \
  --top 60 --prime 32
step 120 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile -rfE -p pytest_failures \
  tests/test_replay_gpu.py tests/test_bookkeeping.py -k "mapped or host_tokens or fetch"
step 100 "$OUT/decode_ab.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 6 \
  --arm copy=replay.fetch=copy
