#!/usr/bin/env bash
# Session 40, call 1 (built in session 39, never run on a GPU; session 39's calls 1 and 2 for session 40 in one call):
# layout CONFIG lane_xproj (DSV4_LANE_XPROJ=1, off): with the lane (on by default since session 39), a compressed
# layer's stacked x linear on it too, forked right after the mHC boundary, so that the main chain (rope table, wq_a +
# wkv, their norms, wq_b) does not wait for it; an HCA layer's pool then reads x's projection after its PDL wait
# (attention._pool_early). The same bits expected.
#   1. tests/test_lanes.py (tiny: the lane with and without the x linear, eager, graph, pooled, batched);
#   2. the gate on mini with DSV4_LANE_XPROJ=1 (the stream 6dd64d77 and final logits 2c87c0e8 expected);
#   3. decode_ab_bench on mini: the defaults against xlane=layout.lane_xproj=1;
#   4. wo_a / wo_b at mini's shapes (world 1) and a Flash rank's (world 2): the defaults against no-split tiles with
#      the unrolled loop (qgemv_bench's *_s1_unroll / *_s2_unroll arms; other bits);
#   5. mini's graph kernels in sequence under the defaults (kernel_table.py), the picture for the next lever;
#   6. benchmarks/step_host_gap.py: the graph arm's step wall beyond its GPU span, pageable against pinned host I/O.
# Usage: OUT=dir bash benchmarks/gpu_s40_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 150 "$OUT/pytest_lanes.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures tests/test_lanes.py
ARMS='^v2_(default|n(8|32)_k(512|1024)_s[12](_w8)?_unroll)$'
step 120 "$OUT/qgemv_world1.txt" python benchmarks/qgemv_bench.py --world 1 --shapes '^wo_' --arms "$ARMS"
step 120 "$OUT/qgemv_world2.txt" python benchmarks/qgemv_bench.py --world 2 --shapes '^wo_' --arms "$ARMS"
step 150 "$OUT/gate_mini_xlane.txt" env DSV4_LANE_XPROJ=1 python -m dsv4.cli gate --preset mini --device cuda \
  --ranks 1 --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini-xlane.txt"
step 150 "$OUT/decode_ab_xlane.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm xlane=layout.lane_xproj=1
step 120 "$OUT/step_host_gap.txt" python benchmarks/step_host_gap.py --preset mini --steps 64 --rounds 4
step 120 "$OUT/kernel_table.txt" python benchmarks/kernel_table.py --preset mini --steps 16 --sequence
