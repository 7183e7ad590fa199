#!/usr/bin/env bash
# Session 19, call 1 on one H200 (<= 9.5 min):
#   1. mini's bench under the defaults with the new pipelined arm (generate's loop on CUDA: the one-row batch graph,
#      one step in flight) beside the graph arm, interleaved; then DSV4_ATTN_FUSED_COMBINE=1; the defaults again;
#   2. tests/test_generation_gpu.py (sample_tokens on CUDA == eager model.step, early stop, graph dropped);
#   3. kernel_table --sequence: each kernel's advance (additive under PDL) and one token's launch order;
#   4. mini against HF transformers' generate on the same weights (issue 10 target 5's x40).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s19_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
BENCH="python -m dsv4.cli bench --preset mini --device cuda --ranks 1 --prime 64 --steps 64 --rows 3"
step 120 "$OUT/bench_mini_1_default.txt" $BENCH  # the cold machine's compiles
step 90 "$OUT/pytest_generation_gpu.txt" python -m pytest -q -p no:cacheprovider tests/test_generation_gpu.py
step 60 "$OUT/kernel_table_mini.txt" python benchmarks/kernel_table.py --preset mini --device cuda --steps 16 \
  --top 45 --sequence
DSV4_ATTN_FUSED_COMBINE=1 step 60 "$OUT/bench_mini_2_fused_combine.txt" $BENCH
step 45 "$OUT/bench_mini_3_default.txt" $BENCH
left=$((565 - SECONDS))
step $left "$OUT/hf_generate_mini.txt" python benchmarks/hf_generate_bench.py --preset mini --device cuda \
  --prompt-tokens 64 --new-tokens 32 --rows 2
