#!/usr/bin/env bash
# Session 42 call 6: attention tiles of 16 keys on by default (call 5's n16 arm; new bits): the gate on mini (its new
# stream), the attention and replay GPU tests, dsv4 against HF transformers' generate on mini's weights, the server.
# Usage: OUT=dir bash benchmarks/gpu_s42_call6.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 110 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda \
  --ranks 1 --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini.txt"
step 120 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -n 3 --dist loadfile -rfE -p pytest_failures \
  tests/test_attention_kernel.py tests/test_replay_gpu.py tests/test_generation_gpu.py -k "not few_heads and not unsupported"
step 150 "$OUT/hf_generate.txt" python benchmarks/hf_generate_bench.py --preset mini --device cuda --prompt-tokens 64 \
  --new-tokens 32 --rows 2
step 150 "$OUT/serve_mini.txt" python benchmarks/serve_bench.py --preset mini --device cuda --prompt-tokens 64 \
  --max-tokens 64 --warmup 1 --concurrency 1,4,16
