#!/usr/bin/env bash
# Session 21, call 4 (one H200, <= 9.5 min), main's tree as call 3's: the GPU suite whole (call 3's was cut at its
# 300 s limit at ~93 % with no failure), then the server on mini with 1,024-token prompts (long prefill chunks:
# the tensor-core tiles and the FP8 kernel) at concurrency 1 and 4.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s21_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
step 420 "$OUT/pytest_gpu_suite.txt" python -m pytest -q -p no:cacheprovider -n 5 --dist loadfile -rfE \
  --durations=15 \
  tests/test_attention_kernel.py tests/test_bookkeeping.py tests/test_cli.py \
  tests/test_commit_step.py tests/test_compressor_kernel.py tests/test_dense_kernel.py \
  tests/test_door_kernel.py tests/test_draw_kernel.py tests/test_geometry_kernel.py \
  tests/test_hc_boundary.py tests/test_hc_head.py tests/test_kernels.py tests/test_moe_decode.py \
  tests/test_moe_decode_options.py tests/test_moe_gl.py tests/test_moe_options_gpu.py \
  tests/test_moe_tc.py tests/test_normrope.py tests/test_pool.py tests/test_prefill.py \
  tests/test_prefill_attention.py tests/test_prefill_batch.py tests/test_prefill_limit.py \
  tests/test_profile.py tests/test_qgemv.py tests/test_qkvfuse.py tests/test_replay_gpu.py \
  tests/test_rope_table.py tests/test_route_kernel.py tests/test_sample_kernel.py \
  tests/test_sampler.py tests/test_topk_kernel.py tests/test_xproj.py tests/test_generation_gpu.py
left=$((560 - SECONDS))
[ $left -gt 60 ] && step $left "$OUT/serve_mini_1024.txt" python benchmarks/serve_bench.py --preset mini \
  --device cuda --concurrency 1,4 --prompt-tokens 1024 --max-tokens 64 --warmup 1
