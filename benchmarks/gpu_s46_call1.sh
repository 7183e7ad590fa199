#!/usr/bin/env bash
# For session 46 (written in session 45 with its device time spent): moe_gl CONFIG down_prefetch (never GPU-run; off by
# default): the shared expert's down linear releases kernel 2 first of all (qgemv.linear's release, RELEASE) and
# kernel 2 prefetches its w2 rows into L2 before its wait (PREFETCH), h read after it. Its CUDA tests, decode_ab on a
# Flash rank and mini, the gate on mini with it on, and the chain's leads with it (does kernel 2 now start under
# kernel 1, and what does it add after the shared linear?). Beside it hc_boundary CONFIG sinkhorn_rcp (also never
# GPU-run, off by default: the finish's divisions without div.full's range checks, the same bits expected): its
# CUDA test, its own decode_ab arm, and the gate with both on (the default stream 96066ac1 says the bits held).
# Usage: OUT=dir bash benchmarks/gpu_s46_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 100 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures tests/test_moe_gl.py \
  tests/test_qgemv.py tests/test_hc_boundary.py -k "prefetch or release or down_early or sinkhorn_rcp"
step 200 "$OUT/decode_ab_flash.txt" python benchmarks/decode_ab_bench.py --preset flash --proxy-world 2 --steps 64 \
  --rounds 4 --arm prefetch=moe_gl.down_prefetch=1 --arm rcp=hc_boundary.sinkhorn_rcp=1
step 70 "$OUT/decode_ab_mini.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm prefetch=moe_gl.down_prefetch=1 --arm rcp=hc_boundary.sinkhorn_rcp=1
DSV4_MOE_GL_DOWN_PREFETCH=1 DSV4_BOUNDARY_RCP=1 step 120 "$OUT/gate.txt" python -m dsv4.cli gate --preset mini \
  --device cuda --ranks 1 \
  --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate.txt"
DSV4_MOE_GL_DOWN_PREFETCH=1 step 100 "$OUT/proxy_seq.txt" python benchmarks/kernel_table.py --preset flash \
  --proxy-world 2 --steps 4 --top 40 --prime 32 --sequence
python benchmarks/chain_leads.py "$OUT/proxy_seq.txt" --top 12 > "$OUT/chain_leads.txt" 2>&1
