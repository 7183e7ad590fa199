#!/usr/bin/env bash
# Session 47's first GPU call (written in a session lent no device). Prefix caching (dsv4/prefix.py, the scheduler's
# lookups, snapshots and hand-overs; `dsv4 serve --prefix-cache`, off by default) and offline batches
# (dsv4.generate_many) are CPU-proven. This runs: `dsv4 gate --prefix-cache` on mini (the gate's checks at main's
# defaults, then cached prefills against plain ones, every byte, and a refusal inside one: PREFIX_IDENTITY,
# PREFIX_REFUSAL); their CUDA tests (a cached prefill's bytes == the plain prefill's at
# short and long chunks on mini; the scheduler's tokens with graphs, with and without the cache); the server on mini at
# main's defaults (its scheduler's Python changed: a lookup that is a no-op without the cache; IDENTITY must hold),
# then with --prefix-cache and a shared 256-token system prompt (IDENTITY again, and the time to first token against
# the first run); dsv4.generate_many against one prompt at a time (the tokens compared).
# Usage: OUT=dir bash benchmarks/gpu_prefix_call.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 90 "$OUT/gate_prefix.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --prime 64 --output 32 \
  --prefix-cache --out "$OUT/receipts-gate-prefix.txt"
step 130 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures tests/test_prefix_cache_gpu.py
step 110 "$OUT/serve_mini.txt" python benchmarks/serve_bench.py --preset mini --device cuda --prompt-tokens 384 \
  --max-tokens 32 --warmup 1 --concurrency 1,4,16 --prefill-chunk 64 --shared-prefix 256
step 110 "$OUT/serve_mini_cached.txt" python benchmarks/serve_bench.py --preset mini --device cuda --prompt-tokens 384 \
  --max-tokens 32 --warmup 1 --concurrency 1,4,16 --prefill-chunk 64 --shared-prefix 256 --prefix-cache 8
step 90 "$OUT/offline_mini.txt" python benchmarks/offline_bench.py --preset mini --device cuda --prompts 32 \
  --prompt-tokens 128 --max-tokens 64 --rounds 3
