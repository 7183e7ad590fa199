#!/usr/bin/env bash
# Session 40, call 4 (call 3's tree): the defaults' decode with the census from the graph (no profiler session in the
# process): decode_ab_bench on mini against widewo=qgemv.v2_wo_tiles=0 and noxlane=layout.lane_xproj=0 (call 2 ran
# the same arms with the profiled census); benchmarks/step_host_gap.py (call 1: launch 166 us); the server on mini.
# Usage: OUT=dir bash benchmarks/gpu_s40_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
step 200 "$OUT/decode_ab.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm widewo=qgemv.v2_wo_tiles=0 --arm noxlane=layout.lane_xproj=0
step 90 "$OUT/step_host_gap.txt" python benchmarks/step_host_gap.py --preset mini --steps 64 --rounds 4
step 150 "$OUT/serve_mini.txt" python benchmarks/serve_bench.py --preset mini --device cuda --prompt-tokens 64 \
  --max-tokens 64 --warmup 1 --concurrency 1,4,16
