#!/usr/bin/env bash
# Session 44, call 3 (one H200): layout CONFIG qkv_norms (kernels/qkv_norms.py: q's latent norm and kv's norm + rope in
# the stacked wq_a / wkv GEMV's launch, by the last row block to finish; off by default, never GPU-run):
#   1. its CUDA tests (the one launch == the GEMV then q_kv_norms at its warps, bit for bit; the reference; no tickets)
#      and normrope's;
#   2. the gate on mini with it on (eager == graph, refusals, batch identity; its own stream);
#   3. decode_ab on the Flash rank proxy and on mini: defaults, qkv.
# Usage: OUT=dir bash benchmarks/gpu_s44_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 100 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures tests/test_qkv_norms.py \
  tests/test_normrope.py -k "not model"
DSV4_QKV_NORMS=1 step 100 "$OUT/gate_qkv.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 \
  --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-qkv.txt"
step 150 "$OUT/decode_ab_flash.txt" python benchmarks/decode_ab_bench.py --preset flash --proxy-world 2 --steps 64 \
  --rounds 4 --arm qkv=layout.qkv_norms=1
step 60 "$OUT/decode_ab_mini.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm qkv=layout.qkv_norms=1
