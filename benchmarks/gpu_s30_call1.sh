#!/usr/bin/env bash
# Session 30, call 1 (one H200, ~6 min):
#   1. the review mend (moe_gl and qgemv_mma import gluon_parts' _jit): their GPU tests and the gate on mini;
#   2. can a short prefill chunk be captured in a CUDA graph today, and what would its replay save
#      (benchmarks/prefill_graph_probe.py: eager against replay, bits compared);
#   3. session 29's unrun call 5 (benchmarks/gpu_next.sh): the concurrency-16 prefill wave's kernels and host side,
#      the pooled 16-row step's kernels with the server's GEMVs.
# Usage: OUT=dir bash benchmarks/gpu_s30_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 150 "$OUT/pytest_jit.txt" python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile -rfE \
  tests/test_moe_gl.py tests/test_qgemv_mma.py
step 60 "$OUT/prefill_graph_probe.txt" python benchmarks/prefill_graph_probe.py --preset mini --tokens 16,63,128 --runs 9
step 100 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 \
  --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini.txt"
PB="python benchmarks/prefill_batch_bench.py mini --tokens 63 --states 16 --runs 2"
step 55 "$OUT/prefill_wave_profile.txt" $PB --profile 20
step 45 "$OUT/prefill_wave_pyprofile.txt" $PB --pyprofile 30
