#!/usr/bin/env bash
# Session 20 call 6 (one H200): DSV4_PREFILL_GEMV (dsv4/model/rows.py step_gemv; off by default): a short
# prefill chunk's GEMVs on the tensor-core tiles (v3), the decode steps on the process's (v2).
#   1. the tests of the changed code with it on, on the GPU: prefill_batch (batched == alone on v3; the chunk on
#      v3 and the decode steps after it on v2, within 2 % of v2's prefill), prefill (against single steps),
#      qgemv and the dense kernel (the kernel argument);
#   2. a 64-token prefill on mini with it on (call 4: 34.5 ms wall, 33.3 ms of kernels, off).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s20_call6.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=10
step 150 "$OUT/pytest_prefill_gemv.txt" env DSV4_PREFILL_GEMV=v3 python -m pytest -q -p no:cacheprovider -n 3 \
  --dist loadfile -rfE tests/test_prefill_batch.py tests/test_prefill.py tests/test_qgemv.py tests/test_dense_kernel.py
step 65 "$OUT/prefill64_prefill_gemv_mini.txt" env DSV4_PREFILL_GEMV=v3 python benchmarks/eager_host_profile.py \
  --preset mini --steps 2 --prefill 64 --top 8
