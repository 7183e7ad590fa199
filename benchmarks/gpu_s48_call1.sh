#!/usr/bin/env bash
# Session 48's first call (the first device since session 45): what sessions 46 and 47 changed on main's default path
# (attention/forward/state plumbing for verify and the MTP layer; the scheduler's prefix lookups; the sampler's method
# lookup) must leave the gate's stream 96066ac1 / 1fd7a9bb; then the prefix cache's gate check and its CUDA tests, the
# speculative verify and undo CUDA tests, the Gumbel draw's device == host test, and the server on mini at main's
# defaults and with --prefix-cache 8 (IDENTITY both, a shared 256-token system prompt).
# Usage: OUT=dir bash benchmarks/gpu_s48_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=14
export DEADLINE_S=${DEADLINE_S:-560}
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests:$PWD"
step 110 "$OUT/gate.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 --prime 64 \
  --output 64 --out "$OUT/receipts-gate.txt"
step 200 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -n 4 --dist loadfile -rfE -p pytest_failures \
  tests/test_prefix_cache_gpu.py tests/test_speculative_gpu.py tests/test_undo.py tests/test_gumbel.py
step 90 "$OUT/gate_prefix.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --prime 64 --output 32 \
  --prefix-cache --out "$OUT/receipts-gate-prefix.txt"
step 100 "$OUT/serve_mini.txt" python benchmarks/serve_bench.py --preset mini --device cuda --prompt-tokens 384 \
  --max-tokens 32 --warmup 1 --concurrency 1,4,16 --prefill-chunk 64 --shared-prefix 256
step 100 "$OUT/serve_mini_cached.txt" python benchmarks/serve_bench.py --preset mini --device cuda --prompt-tokens 384 \
  --max-tokens 32 --warmup 1 --concurrency 1,4,16 --prefill-chunk 64 --shared-prefix 256 --prefix-cache 8
