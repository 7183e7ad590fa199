#!/usr/bin/env bash
# Session 27 call 1 on one H200 (<= 9.2 min), main's tree (gpu_next.sh plus a kernel table): two switches of session 26, both off by default and not yet
# measured on a GPU:
#   DSV4_MOE_GL_MAXNREG=128: moe_gl's kernel 1 built with at most 128 registers a thread (session 26 call 4's ncu of
#     a 16-token step's kernel 1: DRAM 48 % of peak, 3 blocks an SM for want of registers; its sm_90 build under PDL
#     takes 131-133, so 128 lets 4 blocks share an SM; the same bits);
#   DSV4_EXPERT_GROUPS_BLOCKS=1: the groups' table in programs of 32 pairs (its tests passed on the GPU in call 4;
#     call 3's profile put the one-program form at 70 us a layer at 32 rows).
#   1. the register cap's test (the bits capped == uncapped) and the table's tests;
#   2. moe_bench at mini's shapes, 16 / 32 tokens, one process: gl against the caps of 128 and 120 (a one-token step
#      keeps the uncapped build: 96 registers, which the cap would raise to 128) and against the shared programs
#      taking 4 or 2 tokens instead of 8 (gl_s4: 128 registers without spills; gl_s2: 96, 5 blocks an SM; the shared
#      weights read 4 or 8 times a 16-token step instead of 2); all the same bits, so the fastest can be the default;
#   3. the gate on mini with both switches (its batch of 4 takes both: BATCH_IDENTITY, the stream unchanged);
#   4. the server's pooled step at 16 and 32 rows profiled with both switches (the table's launch, kernel 1);
#   5. the server on mini at concurrency 1 / 16 / 32 with both switches, then without (IDENTITY in both).
# If they pay: on by default needs the GPU suite too (the same bits: streams unchanged).
# Usage: OUT=dir bash benchmarks/gpu_next.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 70 "$OUT/pytest_cap.txt" python -m pytest -q -p no:cacheprovider -rfE tests/test_moe_gl.py \
  tests/test_expert_groups.py -k "register_cap or table"
step 80 "$OUT/moe_cap.txt" python benchmarks/moe_bench.py --world 1 --tokens 16,32 \
  --arms '^gl(_maxnreg128|_maxnreg120|_s4|_s2)?$' --calls 32
step 90 "$OUT/gate_mini_both.txt" env DSV4_MOE_GL_MAXNREG=128 DSV4_EXPERT_GROUPS_BLOCKS=1 python -m dsv4.cli gate \
  --preset mini --device cuda --ranks 1 --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini-both.txt"
step 95 "$OUT/batch_mini_pool_both.txt" env DSV4_MOE_GL_MAXNREG=128 DSV4_EXPERT_GROUPS_BLOCKS=1 DSV4_QGEMV=v3 \
  DSV4_DENSE_GEMV=v3 python benchmarks/batch_bench.py mini --pool --sizes 16 32 --steps 32 --rows 3 --profile 16 32 \
  --top 25
step 70 "$OUT/serve_mini_both.txt" env DSV4_MOE_GL_MAXNREG=128 DSV4_EXPERT_GROUPS_BLOCKS=1 python \
  benchmarks/serve_bench.py --preset mini --device cuda --concurrency 1,16,32 --prompt-tokens 64 --max-tokens 64 \
  --warmup 1
step 70 "$OUT/serve_mini.txt" python benchmarks/serve_bench.py --preset mini --device cuda --concurrency 1,16,32 \
  --prompt-tokens 64 --max-tokens 64 --warmup 1
# 6. where mini's solo decode token goes now, kernel by kernel (graph arm; the last per-kernel table is session 19's)
step 45 "$OUT/kernel_table_mini.txt" python benchmarks/kernel_table.py --preset mini --device cuda --steps 16 --top 45
