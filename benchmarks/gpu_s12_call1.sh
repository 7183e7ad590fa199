#!/usr/bin/env bash
# Session 12 call 1 (nvidia-h200, one GPU, <= 9 min), main 66ba204's code:
#   1. what session 11's last call cut: the prefill MoE file's remaining CUDA cases, the sampler's test files whole;
#   2. where a served token's time goes (issue 12: concurrency 1 within 10 % of the graph decode):
#      benchmarks/serve_host.py on mini, v3 (the server's default) and v2: Model.step's graph, step_batch's bucket-1
#      graph, that graph alone, the scheduler's rounds without HTTP (1 and 16 sequences), cProfile of its rounds;
#   3. serve_bench at concurrency 1 with 8 requests (the HTTP path beside 2.), v3 then v2.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s12_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=14
step 100 "$OUT/pytest_prefill_moe.txt" python -m pytest -q -p no:cacheprovider tests/test_prefill.py \
  -k "prefill_moe_kernel or fp4_expert_kernel"
step 100 "$OUT/pytest_sampler.txt" python -m pytest -q -p no:cacheprovider tests/test_sample_kernel.py \
  tests/test_draw_kernel.py tests/test_sampler.py
for g in v3 v2; do
  step 110 "$OUT/serve_host_mini_$g.txt" python benchmarks/serve_host.py --preset mini --device cuda --gemv $g \
    --steps 64 --rows 3 --seqs 16 --top 30
done
for g in v3 v2; do
  step 80 "$OUT/serve_mini_c1_$g.txt" python benchmarks/serve_bench.py --preset mini --device cuda --gemv $g \
    --concurrency 1 --requests 8 --prompt-tokens 64 --max-tokens 64
done
