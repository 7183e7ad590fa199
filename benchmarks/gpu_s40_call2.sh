#!/usr/bin/env bash
# For session 40 (benchmarks only; main's kernels): wo_a / wo_b at mini's shapes (world 1) and a Flash rank's (world 2),
# the defaults against the tiles session 39 call 2 found faster for mini's wo_a through cp.async stages (12.0 us
# against 13.3), now with the unrolled loop (qgemv_bench's *_s1_unroll / *_s2_unroll arms; other bits); and where the
# graph arm's step wall goes beyond its GPU span (benchmarks/step_host_gap.py: Model.step's host parts, pageable
# against pinned host I/O).
# Usage: OUT=dir bash benchmarks/gpu_s40_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
ARMS='^v2_(default|n(8|32)_k(512|1024)_s[12](_w8)?_unroll)$'
step 150 "$OUT/qgemv_world1.txt" python benchmarks/qgemv_bench.py --world 1 --shapes '^wo_' --arms "$ARMS"
step 150 "$OUT/qgemv_world2.txt" python benchmarks/qgemv_bench.py --world 2 --shapes '^wo_' --arms "$ARMS"
step 150 "$OUT/step_host_gap.txt" python benchmarks/step_host_gap.py --preset mini --steps 64 --rounds 4
