#!/usr/bin/env bash
# Session 42 call 3: mapped host I/O for the full-token graph (dsv4.replay CONFIG mapped_io, DSV4_MAPPED_IO=1):
# its GPU tests, decode_ab against the defaults, the bench and the gate with it on.
# Usage: OUT=dir bash benchmarks/gpu_s42_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 240 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -n 3 --dist loadfile -rfE -p pytest_failures \
  tests/test_bookkeeping.py tests/test_replay_gpu.py -k "readback or fetch or mapped or bit_identical or eager_step"
step 130 "$OUT/decode_ab.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 6 \
  --arm mapped=replay.mapped_io=1
DSV4_MAPPED_IO=1 step 80 "$OUT/bench_mapped.txt" python -m dsv4.cli bench --preset mini --device cuda
DSV4_MAPPED_IO=1 step 100 "$OUT/gate_mini_mapped.txt" python -m dsv4.cli gate --preset mini --device cuda \
  --ranks 1 --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini-mapped.txt"
