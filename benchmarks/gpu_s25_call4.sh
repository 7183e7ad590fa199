#!/usr/bin/env bash
# DSV4_QGEMV_V3_WHOLE_CHUNK was removed after this call (slower); the script stays as the record of what ran (benchmarks/RESULTS.md, session 25).
# Session 25 call 4 (one H200, <= 9.5 min): DSV4_QGEMV_V3_WHOLE_CHUNK=1 (off by default, never run on a GPU): a v3
# FP8 program's K chunk (<= 1,024 inputs) loaded as one tile, so that all its weight loads are issued before its first
# product (offline sm_90 SASS of a Flash rank's wo_b: where the loop issues the second tile's loads only after half of
# the first tile's products; call 3's ncu: 44 % of the warps' time waiting on loads, DRAM at 27 %); the same bits.
#   1. its tests on the GPU; 2. qgemv_bench at 1 and 16 rows, v3 against whole / whole with 8 warps; 3. ncu on it;
#   4. if it pays (benchmarks/pick_arm.py '^v3_whole$': bits kept, >= 5 % faster at both row counts): the server on
#      mini with it, then the GPU suite whole with it (the evidence to turn it on by default).
# Usage: OUT=dir bash benchmarks/gpu_s25_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 70 "$OUT/pytest_whole.txt" python -m pytest -q -p no:cacheprovider -rfE tests/test_qgemv.py -k "whole or v3"
step 80 "$OUT/qgemv_whole.txt" python benchmarks/qgemv_bench.py --rows 1,16 --arms '^v3_(default|whole|whole_w8)$'
step 35 "$OUT/ncu_wo_b_whole.txt" ncu --clock-control none --kernel-name regex:qgemv3 --launch-skip 2 \
  --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
  python benchmarks/qgemv_one.py --n 4096 --k 4096 --rows 1 --set kernel=v3 --set v3_whole_chunk=1
ARM=$(python benchmarks/pick_arm.py "$OUT/qgemv_whole.txt" '^v3_whole$' | sed -n 's/^PICK {"arm":"\([^"]*\)".*/\1/p')
echo "picked: ${ARM:-none}" > "$OUT/picked.txt"
if [ -n "$ARM" ]; then
  export DSV4_QGEMV_V3_WHOLE_CHUNK=1
  step 75 "$OUT/serve_mini_whole.txt" python benchmarks/serve_bench.py --preset mini --device cuda --concurrency 1,16 \
    --prompt-tokens 64 --max-tokens 64 --warmup 1
  gpu_suite 300 "$OUT/pytest_gpu_suite_whole.txt" --durations=5
fi
