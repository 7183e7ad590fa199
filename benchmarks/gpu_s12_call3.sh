#!/usr/bin/env bash
# Session 12 call 3 (nvidia-h200, one GPU, <= 10 min), main with the gate's pipelined cells:
#   1. the gate on mini at the seed's sizes (256/256), --batch 4: BATCH_IDENTITY, BATCH_REFUSAL, and the new
#      BATCH_PIPELINED (the server's pipelined steps against solo) and BATCH_PIPELINED_REFUSAL (a refusal with the
#      next step launched behind it: held);
#   2. serve_bench on mini, v3, concurrency 1 and 16, DSV4_PDL 0 then 1 (the scheduler now settles before a
#      prefill round, so a sequence's first token does not wait for the others' prefill);
#   3. where a 16-row step's time goes on v3 (batch_bench --pool --profile 16; session 11 call 4 had v2's).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s12_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
step 230 "$OUT/gate_mini_256.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 \
  --out "$OUT/receipts_gate_mini_256.txt"
for pdl in 0 1; do
  step 110 "$OUT/serve_mini_v3_pdl$pdl.txt" env DSV4_PDL=$pdl python benchmarks/serve_bench.py --preset mini \
    --device cuda --gemv v3 --concurrency 1,16 --prompt-tokens 64 --max-tokens 64
done
step 100 "$OUT/batch_mini_v3.txt" env DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 python benchmarks/batch_bench.py mini \
  --sizes 1 16 --steps 32 --rows 2 --pool --profile 16
