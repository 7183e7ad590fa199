#!/usr/bin/env bash
# Session 39, call 5: mini's eager step, main before this session (a95cdc4's dsv4 package, carried in .old) against
# this tree (the lane: in captured graphs only, never in an eager step), alternated in separate processes:
# benchmarks/eager_host_profile.py's wall per step and its cProfile (where the host's time goes).
# Usage: OUT=dir bash benchmarks/gpu_s39_call5.sh   (carry .whl and .old)
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
for round in 1 2; do
  step 90 "$OUT/eager_old_$round.txt" env PYTHONPATH="$PWD/.old:$PYTHONPATH" python benchmarks/eager_host_profile.py \
    --steps 48 --top 20
  step 90 "$OUT/eager_new_$round.txt" python benchmarks/eager_host_profile.py --steps 48 --top 20
done
