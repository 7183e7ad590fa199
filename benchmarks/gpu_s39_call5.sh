#!/usr/bin/env bash
# Session 39, call 5: mini's eager step, main before this session (a95cdc4's dsv4 package, carried in .old) against
# this tree (the lane: in captured graphs only, never in an eager step), in separate processes one after the other:
# benchmarks/eager_host_profile.py's wall per step and its cProfile (where the host's time goes).
# Usage: OUT=dir bash benchmarks/gpu_s39_call5.sh   (carry .whl and .old)
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
step 110 "$OUT/eager_old.txt" env PYTHONPATH="$PWD/.old:$PYTHONPATH" python benchmarks/eager_host_profile.py \
  --steps 48 --top 20
step 75 "$OUT/eager_new.txt" python benchmarks/eager_host_profile.py --steps 48 --top 20
step 50 "$OUT/eager_old2.txt" env PYTHONPATH="$PWD/.old:$PYTHONPATH" python benchmarks/eager_host_profile.py \
  --steps 48 --top 20
