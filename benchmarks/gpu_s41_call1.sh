#!/usr/bin/env bash
# For session 41 (built in session 40 with no device time left; never run on a GPU): layout CONFIG profile_lane
# (DSV4_PROFILE_LANE=0: a profile's graphs, dsv4.replay.TimedReplay, captured on one stream by lanes.one_stream, so
# that `dsv4 bench --profile` times the compressor and indexer's phase whole instead of the lane's fork alone).
#   1. tests/test_lanes.py (one_stream inside a capture) and tests/test_profile.py under DSV4_PROFILE_LANE=0;
#   2. dsv4 bench --profile on mini, the default (the lane in the profile's graphs) and DSV4_PROFILE_LANE=0: the
#      compressor phase's us a token in each (then flip the default to 0 if the one-stream profile reads right);
#   3. where the pipelined arm's one-row batch graph spends ~20 us a token more than the solo graph (session 40: 1,033
#      against 1,013 us): the batch graph's kernels at B = 1 (batch_bench --profile 1) beside the solo graph's
#      (kernel_table);
#   4. layout CONFIG batch_lean (DSV4_BATCH_LEAN=1, off; never GPU-run: a batched step's counters add the active mask
#      as it is, its keep mask of B rows is the active mask itself, 3 torch launches fewer a step): the pool and
#      generation tests under it, and decode_ab's pipelined arm (the one-row batch graph) against the defaults.
# Usage: OUT=dir bash benchmarks/gpu_s41_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 120 "$OUT/pytest_lanes_profile.txt" env DSV4_PROFILE_LANE=0 python -m pytest -q -p no:cacheprovider -rfE \
  -p pytest_failures tests/test_lanes.py tests/test_profile.py
step 120 "$OUT/bench_profile_lane.txt" python -m dsv4.cli bench --preset mini --device cuda --profile
step 120 "$OUT/bench_profile_one_stream.txt" env DSV4_PROFILE_LANE=0 python -m dsv4.cli bench --preset mini \
  --device cuda --profile
step 150 "$OUT/batch_kernels_b1.txt" python benchmarks/batch_bench.py mini --sizes 1 --rows 2 --profile 1 --top 60
step 90 "$OUT/kernel_table_solo.txt" python benchmarks/kernel_table.py --preset mini --steps 16 --top 60
step 200 "$OUT/pytest_lean.txt" env DSV4_BATCH_LEAN=1 python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile \
  -rfE -p pytest_failures tests/test_generation_gpu.py tests/test_pool.py
step 170 "$OUT/decode_ab_lean.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm lean=layout.batch_lean=1
