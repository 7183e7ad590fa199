#!/usr/bin/env bash
# Session 22 call 3 (one H200, <= 9.5 min): a short prefill chunk's shared expert on the tensor-core tiles (its gate
# and up as two v3 GEMVs, dsv4.kernels.moe CONFIG shared_prefill_tiles; DSV4_MOE_SHARED_PREFILL_TILES=0 the fused
# CUDA-core kernel of before). New bits for prefill chunks: each row's own still.
#   1. tests on the GPU: prefill alone == grouped, prefill, the MoE options, moe_tc;
#   2. the 16 x 63 grouped wave, on (with its profile) and off;
#   3. mini's prefill, on and off; the server at concurrency 1 and 16 (64-token prompts);
#   4. the gate on mini.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s22_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
step 130 "$OUT/pytest_shared.txt" python -m pytest -q -p no:cacheprovider -n 4 --dist loadfile -rfE \
  tests/test_prefill_batch.py tests/test_prefill.py tests/test_moe_options_gpu.py tests/test_moe_tc.py
step 50 "$OUT/prefill_batch_on.txt" python benchmarks/prefill_batch_bench.py mini --states 16 --tokens 63 \
  --runs 3 --profile 12
step 40 "$OUT/prefill_batch_off.txt" env DSV4_MOE_SHARED_PREFILL_TILES=0 python benchmarks/prefill_batch_bench.py \
  mini --states 16 --tokens 63 --runs 3
step 45 "$OUT/prefill_mini_on.txt" python benchmarks/prefill_bench.py mini --sizes 64 128 512 --runs 3 \
  --eager-steps 0 --graph-steps 0 --no-hf
step 40 "$OUT/prefill_mini_off.txt" env DSV4_MOE_SHARED_PREFILL_TILES=0 python benchmarks/prefill_bench.py mini \
  --sizes 64 128 512 --runs 3 --eager-steps 0 --graph-steps 0 --no-hf
step 80 "$OUT/serve_mini.txt" python benchmarks/serve_bench.py --preset mini --device cuda --concurrency 1,16 \
  --prompt-tokens 64 --max-tokens 64 --warmup 1
step 100 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 --prime 64 \
  --output 64 --out "$OUT/receipts-gate-mini.txt"
