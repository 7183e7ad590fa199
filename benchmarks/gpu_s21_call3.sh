#!/usr/bin/env bash
# Session 21, call 3 (one H200, <= 9.5 min), main's tree (long chunks on the tensor-core tiles with 128 columns;
# the FP8 dequant kernel for a long chunk's linears; DSV4_PREFILL_GEMV=v3 by default):
#   1. every test file with CUDA cases (gpu_suite_one.sh's list), 5 workers;
#   2. mini's prefill at 256 / 1,024 / 4,096 tokens with the FP8 kernel and without (DSV4_DEQUANT_FP8=0);
#   3. a 512-token prefill kernel by kernel.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s21_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
step 300 "$OUT/pytest_gpu_suite.txt" python -m pytest -q -p no:cacheprovider -n 5 --dist loadfile -rfE \
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
step 60 "$OUT/prefill_mini_fp8_on.txt" python benchmarks/prefill_bench.py mini --sizes 256 1024 4096 --runs 3 \
  --eager-steps 0 --graph-steps 0 --no-hf
step 55 "$OUT/prefill_mini_fp8_off.txt" env DSV4_DEQUANT_FP8=0 python benchmarks/prefill_bench.py mini \
  --sizes 256 1024 4096 --runs 3 --eager-steps 0 --graph-steps 0 --no-hf
step 50 "$OUT/prefill_kernels_mini_512.txt" python benchmarks/eager_host_profile.py --preset mini --prefill 512 \
  --steps 2 --top 20
