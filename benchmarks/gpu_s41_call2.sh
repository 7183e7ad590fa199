#!/usr/bin/env bash
# For session 41 (built in session 40 with no device time left; never run on a GPU): layout CONFIG profile_lane
# (DSV4_PROFILE_LANE=0: a profile's graphs, dsv4.replay.TimedReplay, captured on one stream by lanes.one_stream, so
# that `dsv4 bench --profile` times the compressor and indexer's phase whole instead of the lane's fork alone).
#   1. tests/test_lanes.py (one_stream inside a capture) and tests/test_profile.py under DSV4_PROFILE_LANE=0;
#   2. dsv4 bench --profile on mini, the default (the lane in the profile's graphs) and DSV4_PROFILE_LANE=0: the
#      compressor phase's us a token in each (flip the default to 0 if the one-stream profile reads right);
#   3. the solo graph's kernels (kernel_table), beside call 1's one-row batch graph's.
# Usage: OUT=dir bash benchmarks/gpu_s41_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 120 "$OUT/pytest_lanes_profile.txt" env DSV4_PROFILE_LANE=0 python -m pytest -q -p no:cacheprovider -rfE \
  -p pytest_failures tests/test_lanes.py tests/test_profile.py
step 110 "$OUT/bench_profile_lane.txt" python -m dsv4.cli bench --preset mini --device cuda --profile
step 110 "$OUT/bench_profile_one_stream.txt" env DSV4_PROFILE_LANE=0 python -m dsv4.cli bench --preset mini \
  --device cuda --profile
step 90 "$OUT/kernel_table_solo.txt" python benchmarks/kernel_table.py --preset mini --steps 16 --top 60
