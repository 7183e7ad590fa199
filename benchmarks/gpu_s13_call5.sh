#!/usr/bin/env bash
# Session 13 call 5 (nvidia-h200, one GPU, <= 6.5 min): longer prompts through the server (512 tokens: eight chunks
# of 64 a prompt, interleaved with the running decode steps), the prefill chunks' experts on the tensor cores (the
# default) against the pair kernels (DSV4_MOE_TC=off), concurrency 1 and 16; then where the pooled 16-row decode step
# goes now (batch_bench --profile 16, v3): the next lever for concurrency 16.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s13_call5.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
for tc in chunks off; do
  step 130 "$OUT/serve_mini_v3_p512_tc$tc.txt" env DSV4_MOE_TC=$tc python benchmarks/serve_bench.py --preset mini \
    --device cuda --gemv v3 --concurrency 1,16 --prompt-tokens 512 --max-tokens 64 --warmup 1
done
step 90 "$OUT/batch_mini_pool16_profile.txt" env DSV4_KERNELS=triton DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 \
  python benchmarks/batch_bench.py mini --sizes 16 --steps 32 --rows 3 --pool --profile 16 --top 25
