#!/usr/bin/env bash
# Session 41, call 5: main with qgemv v2_early_tiles 2, bookkeeping fold_settle and hc_head wide_mix on by default
# (the first two measured in call 4's arms; wide_mix built after it: the head collapse's mix GEMV widens the bf16
# streams as it loads them, no fp32 copy's launch).
#   1. the gate on mini (call 4's stream expected: 30645709 / 91df639e; every switch here keeps the bits);
#   2. the GPU tests of what changed since call 3's tree: down_early's bits, the bookkeeping kernels with both settles,
#      the early tiles' bits, the head collapse's (wide_mix == the copy's), graph == eager, pipelined == step;
#   3. decode_ab: the defaults against each of the three off, and the session's start;
#   4. dsv4 bench on mini, plain and --profile.
# Usage: OUT=dir bash benchmarks/gpu_s41_call5.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 100 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda \
  --ranks 1 --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini.txt"
step 300 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -n 4 --dist loadfile -rfE -p pytest_failures \
  tests/test_moe_gl.py tests/test_bookkeeping.py tests/test_qgemv.py tests/test_hc_head.py tests/test_replay_gpu.py \
  tests/test_generation_gpu.py -k "down_early or bookkeeping or early_tile or hc_head or replay or eager_step \
or pipelined or sample_tokens"
step 130 "$OUT/decode_ab.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm et1=qgemv.v2_early_tiles=1 --arm nofold=bookkeeping.fold_settle=0 --arm narrow=hc_head.wide_mix=0 \
  --arm start=attention.block_n=32,attention.block_h=32,moe_gl.down_early=0,qgemv.v2_early_tiles=1,bookkeeping.fold_settle=0,hc_head.wide_mix=0
step 80 "$OUT/bench.txt" python -m dsv4.cli bench --preset mini --device cuda
step 80 "$OUT/bench_profile.txt" python -m dsv4.cli bench --preset mini --device cuda --profile
