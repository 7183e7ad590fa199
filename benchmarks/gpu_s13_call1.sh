#!/usr/bin/env bash
# Session 13 call 1 (nvidia-h200, one GPU, <= 8 min): the grouped expert kernels' first device run (session 12's
# call 7, benchmarks/gpu_s12_call7.sh), then what they do to a served batch, then where a lone mini token goes now:
#   1-3. call 7: the grouped kernels' CUDA test; a 16 x 63 prefill wave grouped by 8 and 4 rows (against 0.28 s and
#        digest 5fa892ffe594438f); one Flash layer's routed experts at 16 decode tokens grouped (against 390 / 607 us);
#   4. the pooled 16-row batched graph on mini (v3, as the server runs it), grouped off then on (session 11: 10.75 ms);
#   5. mini's solo graph, bench --profile, defaults (the phase table for issue 10 target 5).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s13_call1.sh
source benchmarks/gpu_s12_call7.sh
for g in 0 16; do
  step 90 "$OUT/batch_mini_pool16_grouped$g.txt" env DSV4_MOE_GROUPED=$g DSV4_KERNELS=triton DSV4_QGEMV=v3 \
    DSV4_DENSE_GEMV=v3 python benchmarks/batch_bench.py mini --sizes 16 --steps 32 --rows 3 --pool
done
step 70 "$OUT/bench_mini_profile.txt" python -m dsv4.cli bench --preset mini --device cuda --ranks 1 --prime 64 \
  --steps 64 --rows 2 --profile
