#!/usr/bin/env bash
# Session 41, call 4: main with attention's 64-key / 16-head tiles and moe_gl down_early on by default (call 3's
# arms), and two switches built this session, off by default:
#   qgemv CONFIG v2_early_tiles (DSV4_QGEMV_EARLY_TILES: a stored FP8 weight's first tiles before the wait; wo_b's
#   whole K at 8: 56 -> 80 -> 130 registers at 1 / 4 / 8, no spill);
#   bookkeeping CONFIG fold_settle (DSV4_FOLD_SETTLE=1: the settle from the verdict, the forward counted there).
#   1. the GPU tests of what changed: down_early's bits, the bookkeeping kernels (both folds), the early tiles' bits,
#      the attention kernel at its new tiles, graph == eager;
#   2. the gate on mini (a new stream expected: the attention's tiles);
#   3. decode_ab: the defaults against early tiles 2 / 4 / 8, fold_settle, and the session's start (attention 32 / 32,
#      down_early off);
#   4. dsv4 bench on mini (the standard figure).
# Usage: OUT=dir bash benchmarks/gpu_s41_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 200 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile -rfE -p pytest_failures \
  tests/test_moe_gl.py tests/test_bookkeeping.py tests/test_qgemv.py tests/test_attention_kernel.py \
  tests/test_replay_gpu.py -k "down_early or bookkeeping or settle or model_steps or early_tile or attention or replay \
or eager_step"
step 100 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda \
  --ranks 1 --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini.txt"
step 150 "$OUT/decode_ab.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm et2=qgemv.v2_early_tiles=2 --arm et4=qgemv.v2_early_tiles=4 --arm et8=qgemv.v2_early_tiles=8 \
  --arm fold=bookkeeping.fold_settle=1 \
  --arm start=attention.block_n=32,attention.block_h=32,moe_gl.down_early=0
step 90 "$OUT/bench.txt" python -m dsv4.cli bench --preset mini --device cuda
