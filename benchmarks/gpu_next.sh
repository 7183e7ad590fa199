#!/usr/bin/env bash
# The next call on one H200 (<= 3 min; written as session 30's call 5, refused: too little device time left):
# a short chunk's experts on moe_gl's grouped programs (DSV4_MOE_TC=off: session 29 halved their device time, but
# the eager chunk's wall was its host's) under the prefill graphs, which take the host out: the engine's path with
# and without the graphs at 16 and 63 tokens (call 2 measured the defaults, moe_tc's tiles: 5.9 / 12.9 ms replayed).
# Usage: OUT=dir bash benchmarks/gpu_next.sh   (carry .whl)
source benchmarks/gpu_env.sh
step 120 "$OUT/prefill_graph_probe_gl.txt" env DSV4_MOE_TC=off python benchmarks/prefill_graph_probe.py --preset mini \
  --tokens "" --engine 63:1,16:1 --runs 5
