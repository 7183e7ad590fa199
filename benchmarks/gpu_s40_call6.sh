#!/usr/bin/env bash
# Session 40, call 6 (main with call 5's CUDA code + dsv4.engine CONFIG pinned_io, on: Model.step's token in and
# [token, verdict] out through pinned host buffers, _HostIO):
#   1. decode_ab_bench on mini: the defaults against pageable=engine.pinned_io=0 (Model.step as before; the graph arm
#      is model.step's) and xq=qgemv.v2_xq_tiles=1 (call 5: +0.37 % pipelined, other bits);
#   2. the gate on mini under the defaults (eager and graph arms through Model.step);
#   3. tests/test_replay_gpu.py and tests/test_generation_gpu.py (model.step against the graph, 2 workers).
# Usage: OUT=dir bash benchmarks/gpu_s40_call6.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 170 "$OUT/decode_ab_io.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm pageable=engine.pinned_io=0 --arm xq=qgemv.v2_xq_tiles=1
step 110 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda \
  --ranks 1 --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini-pinned-io.txt"
step 110 "$OUT/pytest_step.txt" python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile -rfE -p pytest_failures \
  tests/test_replay_gpu.py tests/test_generation_gpu.py
