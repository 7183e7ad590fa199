#!/usr/bin/env bash
# Session 34, call 1 (one H200, ~10 min): main with three launch-level switches, off by default, and three changes on:
#   dsv4.kernels.compressor one_pass (DSV4_POOL_ONE_PASS=1): a window whose slots are one block pools in one pass
#   (gates and rows loaded together), pair (DSV4_POOL_PAIR=1): a CSA layer's compressor and indexer pools in one
#   launch; layout xproj_first (DSV4_XPROJ_FIRST=1): the stacked x linear launched right after the mHC boundary.
#   On: the head's bf16 logits widened by settle (no conversion launch), a solo step's readback in one kernel
#   (bookkeeping.readback), and a captured graph's commit table filled after its capture (no memcpy node).
#   1. the changed files' GPU tests (pool one pass / pair bit for bit, the model's decode with the switches, settle with
#      bf16 logits, readback, the captured commit table) and the replay / pool / generation tests; then the replay and
#      pool tests again with the three switches on (graph == eager);
#   2. the gate on mini with the three on (replay, refusals, batch identity; the stream must be sessions 30-33's);
#   3. decode_ab_bench: each switch and all three against the defaults, graph and pipelined, one process (ABBA);
#   4. kernel_table --sequence with the three on: the launches and their advances.
# Usage: OUT=dir bash benchmarks/gpu_s34_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=25
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 200 "$OUT/pytest_changed.txt" python -m pytest -q -p no:cacheprovider -n 3 --dist loadfile --tb=short -rfE \
  -p pytest_failures tests/test_compressor_kernel.py tests/test_bookkeeping.py tests/test_commit_step.py \
  tests/test_replay_gpu.py tests/test_pool.py tests/test_generation_gpu.py
ALL="DSV4_POOL_ONE_PASS=1 DSV4_POOL_PAIR=1 DSV4_XPROJ_FIRST=1"
step 150 "$OUT/pytest_replay_all_on.txt" env $ALL python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile \
  --tb=short -rfE tests/test_replay_gpu.py tests/test_pool.py
step 100 "$OUT/gate_mini_all.txt" env $ALL python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 \
  --prime 64 --output 64 --out "$OUT/receipts-gate-mini-all.txt"
step 300 "$OUT/decode_ab.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm onepass=compressor.one_pass=1 --arm pair=compressor.pair=1 --arm xfirst=layout.xproj_first=1 \
  --arm all=compressor.one_pass=1,compressor.pair=1,layout.xproj_first=1
step 90 "$OUT/kernel_table_all.txt" env $ALL python benchmarks/kernel_table.py --preset mini --device cuda \
  --steps 16 --sequence --top 40
