#!/usr/bin/env bash
# For session 42 (written in session 41 with no device time left; main's defaults, nothing new to land):
#   1. where the graph arm's host time went in session 41's call 6 (step_host_gap: the launch 58-78 us a token,
#      session 40's 22.6): graph_launch_bench's synthetic graphs and mini's full-token graph, then step_host_gap, on
#      one machine;
#   2. decode_ab arms that need no code: 3 early tiles, attention tiles of 32 or 128 keys (16 heads), the combine in 8
#      warps;
#   3. dsv4 bench on mini.
# Usage: OUT=dir bash benchmarks/gpu_s42_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
step 120 "$OUT/graph_launch.txt" python benchmarks/graph_launch_bench.py --mini
step 90 "$OUT/step_host_gap.txt" python benchmarks/step_host_gap.py --preset mini --steps 64 --rounds 4
step 150 "$OUT/decode_ab.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm et3=qgemv.v2_early_tiles=3 --arm n32=attention.block_n=32 --arm n128=attention.block_n=128 \
  --arm cw8=attention.combine_warps=8
step 80 "$OUT/bench.txt" python -m dsv4.cli bench --preset mini --device cuda
