#!/usr/bin/env bash
# Session 41, call 3: moe_gl CONFIG down_early (DSV4_MOE_GL_DOWN_EARLY=1, built this session, off: kernel 2's
# tensor-core programs of a step without groups make their sums before their wait, where h is two launches back):
#   1. test_moe_gl's early cases (kernel 2 early == not, bit for bit) and the generation tests under it;
#   2. the gate on mini under it (the same stream expected: 61800865 / bd96b9e9);
#   3. decode_ab: down_early, and attention tiles of 64 keys (bench at a rank's 32 heads, session 20: sliding 10.5 ->
#      9.5 us, CSA 14.1 -> 12.3 with 16 heads a program), against the defaults.
# Usage: OUT=dir bash benchmarks/gpu_s41_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 150 "$OUT/pytest_down_early.txt" env DSV4_MOE_GL_DOWN_EARLY=1 python -m pytest -q -p no:cacheprovider -n 2 \
  --dist loadfile -rfE -p pytest_failures tests/test_moe_gl.py tests/test_generation_gpu.py \
  -k "early or remote or gluon_experts or generat or pipelin or stream"
step 110 "$OUT/gate_mini_down_early.txt" env DSV4_MOE_GL_DOWN_EARLY=1 python -m dsv4.cli gate --preset mini \
  --device cuda --ranks 1 --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini-down-early.txt"
step 280 "$OUT/decode_ab.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm down_early=moe_gl.down_early=1 --arm attn_n64_h16=attention.block_n=64,attention.block_h=16 \
  --arm attn_n64=attention.block_n=64
