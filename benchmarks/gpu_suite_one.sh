#!/usr/bin/env bash
# Every test file with CUDA cases, on one H200, in 5 xdist workers (one file a worker: pytest-xdist carried in .whl;
# 5 keeps the files that build mini, ~22 GB each, within the GPU's memory), <= 9 min. Several of these files last ran
# on the device sessions ago (the GPU rule checks a change's own tests; a stale test, like session 17's
# test_moe_options_gpu, is found here). The CPU-only files are CI's.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_suite_one.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step ${SUITE_LIMIT:-520} "$OUT/pytest_gpu_suite.txt" python -m pytest -q -p no:cacheprovider -n 5 --dist loadfile -rfE \
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
