#!/usr/bin/env bash
# Session 47's second GPU call (after gpu_prefix_call.sh has passed): a conversation's time to first token per turn on
# mini, plain at the server's default chunk, plain and cached at 256 and at 1,024 (benchmarks/prefix_cache_bench.py
# checks the cached tokens against the plain ones; exit 1 when they differ).
# Usage: OUT=dir bash benchmarks/gpu_prefix_bench.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 250 "$OUT/prefix_mini_256.txt" python benchmarks/prefix_cache_bench.py --preset mini --device cuda \
  --system 2048 --turns 6 --message 128 --reply 128 --chunk 256 --rows 4 --max-model-len 8192
step 250 "$OUT/prefix_mini_1024.txt" python benchmarks/prefix_cache_bench.py --preset mini --device cuda \
  --system 2048 --turns 6 --message 128 --reply 128 --chunk 1024 --rows 4 --max-model-len 8192
# dsv4 bench --prefill (session 47): mini's prefill at 1,024 and 4,096 tokens beside its decode rows.
step 80 "$OUT/bench_prefill_mini.txt" python -m dsv4.cli bench --preset mini --device cuda --prime 64 --steps 32 \
  --rows 3 --prefill 1024,4096
