#!/usr/bin/env bash
# DSV4_QGEMV_V3_WALK and benchmarks/pick_walk.py were removed after this call (no gain); the script stays as the record of what ran (benchmarks/RESULTS.md, session 25).
# Session 25 call 3 (one H200, <= 9.5 min): DSV4_QGEMV_V3_WALK=P (off by default, never run on a GPU): v3's FP8
# launches of at least P N blocks run P programs that walk the blocks, each block's K splits in turn, in one loop
# Triton pipelines (offline sm_90 SASS: cp.async where a program of one (block, split) has none); the same bits.
#   1. its tests on the GPU (bit for bit against the plain kernel);
#   2. qgemv_bench at 1 and 16 rows, v3 against walk64 / walk128 / walk256 (bits_as_v3_default must hold);
#   3. ncu on the plain v3 kernel at a Flash rank's wo_b (4096 x 4096, one row): why it streams at a third of the
#      bandwidth (occupancy, stalls, memory throughput), if ncu reads the counters here;
#   4. if an arm pays (benchmarks/pick_walk.py: bits kept, >= 5 % faster at both row counts): the server on mini with
#      it, then the GPU suite whole with it (the evidence to turn it on by default).
# Usage: OUT=dir bash benchmarks/gpu_s25_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 50 "$OUT/pytest_walk.txt" python -m pytest -q -p no:cacheprovider -rfE tests/test_qgemv.py -k "walk or v3"
step 80 "$OUT/qgemv_walk.txt" python benchmarks/qgemv_bench.py --rows 1,16 --arms '^v3_(default|walk64|walk128|walk256)$'
step 35 "$OUT/ncu_wo_b.txt" ncu --clock-control none --kernel-name regex:qgemv3 --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
  --section LaunchStats python benchmarks/qgemv_one.py --n 4096 --k 4096 --rows 1 --set kernel=v3
P=$(python benchmarks/pick_walk.py "$OUT/qgemv_walk.txt")
echo "picked walkers: ${P:-none}" > "$OUT/picked.txt"
if [ -n "$P" ]; then
  export DSV4_QGEMV_V3_WALK=$P
  step 75 "$OUT/serve_mini_walk.txt" python benchmarks/serve_bench.py --preset mini --device cuda --concurrency 1,16 \
    --prompt-tokens 64 --max-tokens 64 --warmup 1
  gpu_suite 300 "$OUT/pytest_gpu_suite_walk.txt" --durations=5
fi
