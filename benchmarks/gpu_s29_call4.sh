#!/usr/bin/env bash
# Session 29, call 4 (one H200): a short prefill chunk's routed experts on the decode kernels' grouped programs by
# default (dsv4.kernels.moe_tc CONFIG mode "long"; "chunks", moe_tc's tiles, before), the groups' table dense where
# the pairs outnumber the groups they can make (dsv4.kernels.expert_groups: a program row a group, not a pair).
#   1. pytest: the groups' tables (dense included), moe_gl's grouped == ungrouped (dense tables, 1,200 pairs),
#      moe_tc's modes, batched prefill == each chunk alone, prefill against single steps;
#   2. prefill_batch_bench on mini: one 63-token chunk and a wave of 16, the new default against mode "chunks" in one
#      process (interleaved rounds);
#   3. the gate on mini (its 64-token prime takes the new path; batched == solo);
#   4. the server on mini at concurrency 1 / 4 / 16 / 32 (a throwaway server first), IDENTITY.
# Usage: OUT=dir bash benchmarks/gpu_s29_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=45
step 170 "$OUT/pytest_moe_prefill.txt" python -m pytest -q -p no:cacheprovider -n 5 --dist loadfile -rfE \
  tests/test_expert_groups.py tests/test_moe_gl.py tests/test_moe_tc.py tests/test_prefill_batch.py tests/test_prefill.py
PB="python benchmarks/prefill_batch_bench.py mini --tokens 63"
step 50 "$OUT/prefill_ab_1.txt" $PB --states 1 --runs 7 --arm tc=moe_tc.mode=chunks
step 70 "$OUT/prefill_ab_16.txt" $PB --states 16 --runs 3 --arm tc=moe_tc.mode=chunks
step 100 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 \
  --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini.txt"
SERVE="python benchmarks/serve_bench.py --preset mini --device cuda --prompt-tokens 64 --max-tokens 64 --warmup 1"
step 60 "$OUT/serve_warm.txt" $SERVE --concurrency 1
step 80 "$OUT/serve_mini.txt" $SERVE --concurrency 1,4,16,32
