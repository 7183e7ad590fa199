#!/usr/bin/env bash
# Session 26 call 2 (one H200, <= 9.5 min): a batched step's (token, expert) pairs grouped by expert for moe_gl's
# tensor-core programs (DSV4_MOE_GL_GROUPED=1, off by default, never run on a GPU before this call;
# dsv4/kernels/expert_groups.py builds the table). Call 1's profile of the server's pooled 16-row step on mini: the
# two expert kernels 2,980 of its 4,774 us, each (token, expert) pair reading its expert alone (96 pairs, ~81
# experts a layer). Grouped, an expert's tiles are read once for up to 8 tokens, one a column of the MMA: the same
# bits (a column reads its own column of x), so the tests hold grouped == ungrouped bit for bit.
#   1. the Gluon experts' tests and the table's (each grouped case against the ungrouped programs' bits);
#   only if they pass:
#   2. moe_bench at mini's shapes (world 1) at 1, 16 and 32 tokens, "gl" against "gl_grouped" in one process;
#   3. the gate on mini with the switch on (its batch of 4 takes the grouped programs: batched == solo);
#   4. the server on mini at concurrency 1 / 16 / 32, grouped and not (IDENTITY must hold in both).
# Usage: OUT=dir bash benchmarks/gpu_s26_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 150 "$OUT/pytest_grouped.txt" python -m pytest -q -p no:cacheprovider -rfE tests/test_moe_gl.py \
  tests/test_expert_groups.py
if ! grep -q "^rc=0" "$OUT/pytest_grouped.txt"; then exit 0; fi
step 110 "$OUT/moe_grouped.txt" python benchmarks/moe_bench.py --world 1 --tokens 1,16,32 --arms '^gl(_grouped)?$' \
  --calls 32
step 95 "$OUT/gate_mini_grouped.txt" env DSV4_MOE_GL_GROUPED=1 python -m dsv4.cli gate --preset mini --device cuda \
  --ranks 1 --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini-grouped.txt"
step 85 "$OUT/serve_mini_grouped.txt" env DSV4_MOE_GL_GROUPED=1 python benchmarks/serve_bench.py --preset mini \
  --device cuda --concurrency 1,16,32 --prompt-tokens 64 --max-tokens 64 --warmup 1
step 85 "$OUT/serve_mini.txt" python benchmarks/serve_bench.py --preset mini --device cuda --concurrency 1,16,32 \
  --prompt-tokens 64 --max-tokens 64 --warmup 1
