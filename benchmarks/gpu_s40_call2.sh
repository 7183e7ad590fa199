#!/usr/bin/env bash
# Session 40, call 2: main with lane_xproj on by default (call 1: +2.05 % pipelined, the gate's stream) and qgemv's
# WO_TILES (CONFIG v2_wo_tiles, on: wo_a / wo_b in 8-row blocks of 1,024-input tiles, 8 warps, unsplit; call 1's
# qgemv_bench: mini 13.79 -> 11.43 / 11.79 -> 10.86 us; other bits):
#   1. tests/test_qgemv.py's tile cases (the rule, the launch at the rule's tiles against the reference, row by row);
#   2. decode_ab_bench on mini: the defaults against widewo=qgemv.v2_wo_tiles=0 and noxlane=layout.lane_xproj=0;
#   3. the gate on mini under the defaults (a new stream expected: the wo tiles' bits);
#   4. benchmarks/graph_launch_bench.py: the host's cost of a graph launch by nodes, PDL and streams, mini's graph
#      (DSV4_PDL=1 with mini, DSV4_PDL=0 synthetic only);
#   5. qgemv_bench at mini's other FP8 shapes: the defaults against the wo tiles' form and 8-row / 8-warp splits.
# Usage: OUT=dir bash benchmarks/gpu_s40_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 100 "$OUT/pytest_tiles.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures tests/test_qgemv.py \
  -k "shape_tiles or tile_loop or early_tile"
step 200 "$OUT/decode_ab_wo.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm widewo=qgemv.v2_wo_tiles=0 --arm noxlane=layout.lane_xproj=0
step 120 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda \
  --ranks 1 --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini-wo.txt"
step 100 "$OUT/graph_launch_pdl1.txt" env DSV4_PDL=1 python benchmarks/graph_launch_bench.py --mini
step 50 "$OUT/graph_launch_pdl0.txt" env DSV4_PDL=0 python benchmarks/graph_launch_bench.py
step 80 "$OUT/qgemv_other.txt" python benchmarks/qgemv_bench.py --world 1 --shapes '^(wq_|wkv|indexer.wq|shared.w2)' \
  --arms '^v2_(default|n8_k1024_s1_w8_unroll|n8_k1024_w8|n8_k2048_w8)$'
