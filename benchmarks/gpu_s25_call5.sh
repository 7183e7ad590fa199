#!/usr/bin/env bash
# Session 25 call 5 (one H200, ~4.5 min): the landed tree (dsv4/ as call 2's 0e40279): the server at concurrency 1, 4,
# 16 and 32 with the shared / wave tiles on; the wave A/B against both off (one process); ncu on v2 at a Flash rank's
# wo_b (one row: the decode's kernel, at 0.55 of the bandwidth) and on v3 at 16 rows, beside call 3's v3 one-row run.
# Usage: OUT=dir bash benchmarks/gpu_s25_call5.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
step 110 "$OUT/serve_mini.txt" python benchmarks/serve_bench.py --preset mini --device cuda --concurrency 1,4,16,32 \
  --prompt-tokens 64 --max-tokens 64 --warmup 1
step 70 "$OUT/wave_ab.txt" python benchmarks/prefill_batch_bench.py mini --states 16 --tokens 63 --runs 5 \
  --arm off=moe.shared_prefill_tiles=0,moe_tc.wave_tiles=0
NCU="ncu --clock-control none --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy
  --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats"
step 35 "$OUT/ncu_wo_b_v2.txt" $NCU --kernel-name regex:qgemv2 python benchmarks/qgemv_one.py --n 4096 --k 4096 \
  --rows 1 --set kernel=v2
step 35 "$OUT/ncu_wo_b_v3_rows16.txt" $NCU --kernel-name regex:qgemv3 python benchmarks/qgemv_one.py --n 4096 \
  --k 4096 --rows 16 --set kernel=v3
