#!/usr/bin/env bash
# Session 23 call 4 (one H200, ~6 min): the bf16 decode's one-product form (moe_tc.decode_kind 2: every scale byte
# of a launch's stacks at most 128, as in every checkpoint; the scale times 2**126 one bf16 factor; SASS K step 1,165
# -> 1,095 instructions, 1,623 before the bf16 decode); the same bits again.
#   1. its tests on the GPU (both kinds equal the fp16 placement bit for bit);
#   2. prefill_moe_bench: tc (now kind 2) against tc_fp16 (the decode before session 23);
#   3. mini's prefill 64 to 4,096 tokens (logits_sha equal to calls 2's: 564cce9f c4b88a40 e6a850bd cb44e61c 8cd93d70);
#   4. the 16 x 63 wave and one chunk (digests 9c7adc3e..., 10e576ff...);
#   5. the server on mini at concurrency 1 and 16 (64-token prompts): TTFT with the new default.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s23_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
step 50 "$OUT/pytest_bf16.txt" python -m pytest -q -p no:cacheprovider -rfE tests/test_moe_tc.py -k "bf16 or decode_kind"
step 60 "$OUT/prefill_moe_mini.txt" python benchmarks/prefill_moe_bench.py --n-local 256 --tokens 64,128,512,1024 \
  --arms "^tc$|^tc_fp16$|^tc_bm32_n128$"
step 80 "$OUT/prefill_mini.txt" python benchmarks/prefill_bench.py mini --sizes 64 128 512 1024 4096 --runs 4 \
  --eager-steps 0 --graph-steps 0 --no-hf
step 45 "$OUT/prefill_batch.txt" python benchmarks/prefill_batch_bench.py mini --states 16 --tokens 63 --runs 3
step 100 "$OUT/serve_mini.txt" python benchmarks/serve_bench.py --preset mini --device cuda --concurrency 1,16 \
  --prompt-tokens 64 --max-tokens 64 --warmup 1
