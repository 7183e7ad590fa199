#!/usr/bin/env bash
# The next call on one H200 (<= 9.5 min), main's tree: DSV4_MOE_TC_ORDER=natural and planes_one (session 21, written
# and compiled for sm_90 offline, never run on a GPU: off by default). moe_tc, the tensor-core tiles of every prefill chunk's
# routed experts, is 65-73 % of a prefill on mini (session 21); its compiled K loop issues eight dots a projection,
# each waiting for the last (A operand in registers: TTGIR warp_group_dot_wait pendings 0); "natural" joins the
# planes into one dot a K step (pendings 15: the wgmmas issue back to back) and reads x's rows contiguously (other
# bits); planes_one makes the same one dot in the planes' order (2 waits a K step, not 16; the default's bits).
#   1. their tests on the GPU (test_moe_tc.py: agreement, planes_one == planes bit for bit, rows alone == batch;
#      with planes_one the default, prefill batch == alone);
#   2. prefill_moe_bench, mini's 256 experts, tc against tc_nat arms at 64 to 4,096 tokens (bit_equal_tc: whether a
#      tile shape changes a pair's bits, for block_n 128 in a short chunk's fixed shape); a Flash rank's 128;
#   3. mini's prefill (prefill_bench, default chunk) and the server's concurrency-16 wave (time to first token),
#      planes / planes_one.
# If planes_one wins and equals planes bit for bit: make it the default (the same bits: its tests and the suite).
# If natural wins by more: its bits are new (the gate and gpu_suite_one.sh with it on before a default).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_next.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 120 "$OUT/pytest_orders.txt" env DSV4_MOE_TC_ORDER=planes_one python -m pytest -q -p no:cacheprovider -n 3 \
  --dist loadfile -rfE tests/test_moe_tc.py tests/test_prefill_batch.py tests/test_prefill.py
step 80 "$OUT/prefill_moe_mini.txt" python benchmarks/prefill_moe_bench.py --n-local 256 \
  --tokens 64,128,512,1024,4096 --arms "^tc$|tc_n128$|tc_bm32_n128|tc_bm64_n128$|tc_nat|tc_one"
step 40 "$OUT/prefill_moe_flash_rank.txt" python benchmarks/prefill_moe_bench.py --n-local 128 \
  --tokens 128,1024,4096 --arms "^tc$|tc_n128$|tc_bm64_n128$|tc_nat$|tc_nat_n128$|tc_one$|tc_one_n128$"
step 60 "$OUT/prefill_mini_planes.txt" python benchmarks/prefill_bench.py mini --sizes 64 128 512 1024 4096 \
  --runs 3 --eager-steps 0 --graph-steps 0 --no-hf
step 60 "$OUT/prefill_mini_planes_one.txt" env DSV4_MOE_TC_ORDER=planes_one python benchmarks/prefill_bench.py mini \
  --sizes 64 128 512 1024 4096 --runs 3 --eager-steps 0 --graph-steps 0 --no-hf
step 75 "$OUT/serve_mini_c16_planes.txt" python benchmarks/serve_bench.py --preset mini --device cuda \
  --concurrency 16 --prompt-tokens 64 --max-tokens 16 --warmup 1
step 75 "$OUT/serve_mini_c16_one.txt" env DSV4_MOE_TC_ORDER=planes_one python benchmarks/serve_bench.py \
  --preset mini --device cuda --concurrency 16 --prompt-tokens 64 --max-tokens 16 --warmup 1
