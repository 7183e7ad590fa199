#!/usr/bin/env bash
# Session 29, call 2 (one H200): a short prefill chunk's routed experts on moe_gl's grouped tensor-core programs
# (the decode kernels: an expert's bytes read once for up to 8 of the chunk's pairs) against moe_tc's tiles (the
# default since session 15), by the existing switch moe_tc CONFIG mode ("off": a rows-alone chunk takes the decode
# kernels). expert_groups' blocks form now takes more than MAX_PAIRS pairs (a 63-token chunk is 378 pairs, a wave of
# 16 such chunks 6,048): its tests and moe_gl's grouped-equals-ungrouped test at 200 tokens (1,200 pairs) first.
#   1. pytest: tests/test_expert_groups.py, tests/test_moe_gl.py's grouped tests;
#   2. prefill_batch_bench on mini, one 63-token chunk (a 64-token prompt's prefill: the server's TTFT at concurrency
#      1) and a wave of 16, defaults against moe_tc.mode=off in one process (interleaved rounds);
#   3. one 63-token chunk's kernels with it off (the profile).
# Usage: OUT=dir bash benchmarks/gpu_s29_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=60
step 110 "$OUT/pytest_groups.txt" python -m pytest -q -p no:cacheprovider -rfE tests/test_expert_groups.py \
  tests/test_moe_gl.py -k "grouped or table or supported"
PB="python benchmarks/prefill_batch_bench.py mini --tokens 63"
step 80 "$OUT/prefill_ab_1.txt" $PB --states 1 --runs 7 --arm gl=moe_tc.mode=off
step 120 "$OUT/prefill_ab_16.txt" $PB --states 16 --runs 3 --arm gl=moe_tc.mode=off
step 60 "$OUT/prefill_gl_1_profile.txt" env DSV4_MOE_TC=off $PB --states 1 --runs 1 --profile 14
