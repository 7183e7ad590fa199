#!/usr/bin/env bash
# Session 27 call 3 on one H200 (<= 9.3 min; two refused starts put calls 3 and 4 into one): main's tree with call 1's
# two same-bits defaults (moe_gl's shared programs of 4 tokens, expert_groups' blocks form; call 2 ran its tests and
# the gate with them) and the mma GEMV family (dsv4/kernels/qgemv_mma.py, DSV4_QGEMV=mma / --gemv mma: the FP8
# weights the A operand of m16n8k16 products, up to 8 rows their columns; off by default, never run on a GPU before):
#   1. mma's tests (against the reference, every row alone == in a batch, grouped, sliced, the second launch, a graph,
#      the weights it refuses on v3);
#   2. the GPU files of the new defaults (the Gluon experts, the table, the pooled steps, generation, the options);
#   3. qgemv_bench --rows 1,8,16 on a Flash rank's FP8 linears: v2 (8 rows a program), v3, mma's tiles (rows_exact);
#   4. the server on mini at concurrency 1 / 4 / 16 / 32, its default (v3) then the mma family (IDENTITY in both);
#   5. mini's solo decode with --gemv mma (v2's: 853 tok/s pipelined, sessions 24-27);
#   6. the gate on mini with --gemv mma (eager == graph, the batch of 4 == solo, refusals).
# Usage: OUT=dir bash benchmarks/gpu_s27_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 60 "$OUT/pytest_mma.txt" python -m pytest -q -p no:cacheprovider -rfE tests/test_qgemv_mma.py
step 140 "$OUT/pytest_moe_pool.txt" python -m pytest -q -p no:cacheprovider -n 4 --dist loadfile -rfE \
  tests/test_moe_gl.py tests/test_expert_groups.py tests/test_pool.py tests/test_generation_gpu.py \
  tests/test_moe_options_gpu.py
step 75 "$OUT/qgemv_mma_rows.txt" python benchmarks/qgemv_bench.py --world 2 --rows 1,8,16 \
  --arms '^(v2_rows8|v3_default|mma_.*)$'
SERVE="python benchmarks/serve_bench.py --preset mini --device cuda --concurrency 1,4,16,32 --prompt-tokens 64 \
  --max-tokens 64 --warmup 1"
step 70 "$OUT/serve_mini.txt" $SERVE
step 70 "$OUT/serve_mini_mma.txt" env DSV4_QGEMV=mma DSV4_DENSE_GEMV=v3 $SERVE
step 50 "$OUT/bench_mini_mma.txt" python -m dsv4.cli bench --preset mini --device cuda --prime 64 --steps 64 --rows 3 \
  --gemv mma
step 85 "$OUT/gate_mini_mma.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --gemv mma \
  --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini-mma.txt"
