#!/usr/bin/env bash
# Session 42 call 5: main's new defaults (mapped_io, attention tiles of 32 keys with the split-D combine, route in one
# warp): the gate on mini (new bits: its new stream), their GPU tests, decode_ab against the session's start and
# arms around the new attention tiles, dsv4 bench.
# Usage: OUT=dir bash benchmarks/gpu_s42_call5.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 110 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda \
  --ranks 1 --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini.txt"
step 230 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -n 4 --dist loadfile -rfE -p pytest_failures \
  tests/test_attention_kernel.py tests/test_route_kernel.py tests/test_replay_gpu.py tests/test_generation_gpu.py \
  tests/test_pool.py -k "not few_heads and not unsupported"
step 150 "$OUT/decode_ab.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm start=attention.block_n=64,attention.combine_split_d=0,route.num_warps=4,replay.mapped_io=0 \
  --arm n16=attention.block_n=16 --arm h8=attention.block_h=8 --arm cw2=attention.combine_warps=2
step 80 "$OUT/bench.txt" python -m dsv4.cli bench --preset mini --device cuda
