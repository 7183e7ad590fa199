#!/usr/bin/env bash
# Session 18, call 2 (one H200, <= 9 min): DSV4_PDL with every Triton kernel launched with launch_pdl (pdl_wait
# first, or after a stored weight's first tile): mini's solo graph PDL off / on / off / on, on with DSV4_HC_HEAD=1
# (hc_head's 7 torch launches -> 1 kernel inside the chain); mini's kernels a token under PDL; the gate on mini under
# PDL (graph == eager, the refusal cells, the receipts).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s18_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
BENCH="python -m dsv4.cli bench --preset mini --device cuda --ranks 1 --prime 64 --steps 64 --rows 3"
DSV4_PDL=0 step 80 "$OUT/bench_mini_pdl0_a.txt" $BENCH
DSV4_PDL=1 step 80 "$OUT/bench_mini_pdl1_a.txt" $BENCH
DSV4_PDL=0 step 45 "$OUT/bench_mini_pdl0_b.txt" $BENCH
DSV4_PDL=1 step 45 "$OUT/bench_mini_pdl1_b.txt" $BENCH
DSV4_PDL=1 DSV4_HC_HEAD=1 step 50 "$OUT/bench_mini_pdl1_hc_head.txt" $BENCH
DSV4_PDL=1 step 60 "$OUT/kernel_table_mini_pdl1.txt" python benchmarks/kernel_table.py --preset mini --steps 16
DSV4_PDL=1 step 120 "$OUT/gate_mini_batch4_pdl1.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 \
  --batch 4 --prime 64 --output 64 --out "$OUT/receipts_gate_mini_64_pdl1.txt"
