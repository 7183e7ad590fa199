#!/usr/bin/env bash
# Prefix caching's first GPU run (written in session 47, which was lent no device; dsv4/prefix.py and the scheduler's
# use of it are CPU-proven and off by default: `dsv4 serve --prefix-cache`). Its CUDA tests (a cached prefill's bytes
# == the plain prefill's at short and long chunks on mini; the scheduler's tokens with graphs, with and without the
# cache), then a conversation's time to first token per turn on mini: plain at the server's default chunk, plain and
# cached at 256 and at 1,024 (benchmarks/prefix_cache_bench.py checks the cached tokens against the plain ones).
# Then dsv4.generate_many against one prompt at a time on mini (offline_bench.py, the tokens compared).
# Usage: OUT=dir bash benchmarks/gpu_prefix_call.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 150 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures tests/test_prefix_cache_gpu.py \
  tests/test_offline.py
step 150 "$OUT/prefix_mini_256.txt" python benchmarks/prefix_cache_bench.py --preset mini --device cuda \
  --system 2048 --turns 6 --message 128 --reply 128 --chunk 256 --rows 4 --max-model-len 8192
step 150 "$OUT/prefix_mini_1024.txt" python benchmarks/prefix_cache_bench.py --preset mini --device cuda \
  --system 2048 --turns 6 --message 128 --reply 128 --chunk 1024 --rows 4 --max-model-len 8192
# Offline batch generation (dsv4.generate_many, session 47): 32 prompts batched against one by one, tokens compared.
step 120 "$OUT/offline_mini.txt" python benchmarks/offline_bench.py --preset mini --device cuda --prompts 32 \
  --prompt-tokens 128 --max-tokens 64 --rounds 3
