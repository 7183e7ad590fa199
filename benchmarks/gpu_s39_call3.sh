#!/usr/bin/env bash
# Session 39, call 3: a compressed layer's compressor and indexer on the device's second stream (dsv4.kernels.lanes,
# layout CONFIG lane, DSV4_LANE=1; off by default), beside the queries' wq_b GEMV, norm and RoPE, joined before the
# attention kernel; the split-K tickets per lane. The same kernels on the same inputs: the same bits expected.
#   1. tests/test_lanes.py (tiny: lane on == off, eager, graph, pooled, a batched graph) and, with DSV4_LANE=1,
#      tests/test_replay_gpu.py (mini: 256 sampled steps, graph == eager, no host sync in the eager step);
#   2. the gate on mini with DSV4_LANE=1 (the stream 6dd64d77 and final logits 2c87c0e8 expected);
#   3. decode_ab_bench on mini: the defaults against lane=layout.lane=1.
# Usage: OUT=dir bash benchmarks/gpu_s39_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 150 "$OUT/pytest_lanes.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures tests/test_lanes.py
step 200 "$OUT/pytest_replay_lane.txt" env DSV4_LANE=1 python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures \
  tests/test_replay_gpu.py
step 120 "$OUT/gate_mini_lane.txt" env DSV4_LANE=1 python -m dsv4.cli gate --preset mini --device cuda --ranks 1 \
  --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini-lane.txt"
step 130 "$OUT/decode_ab_lane.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm lane=layout.lane=1
