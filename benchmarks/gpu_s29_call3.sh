#!/usr/bin/env bash
# Session 29, call 3 (one H200): where a short prefill's host time goes (call 2: one 63-token chunk on mini is 8.5 ms
# of kernels in a ~15-21 ms wall):
#   1. prefill_host.py, a 64-token prompt on mini: wall against enqueue time, the synchronizing call sites, the host
#      ops by self time, the kernels (defaults, then the experts on the decode kernels);
#   2. prefill_batch_bench --pyprofile: one 63-token chunk under cProfile, the Python functions of most own time.
# Usage: OUT=dir bash benchmarks/gpu_s29_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=90
step 90 "$OUT/prefill_host_mini.txt" python benchmarks/prefill_host.py --preset mini --ranks 1 --tokens 64 --top 40
step 60 "$OUT/prefill_host_mini_gl.txt" env DSV4_MOE_TC=off python benchmarks/prefill_host.py --preset mini --ranks 1 \
  --tokens 64 --top 25
step 60 "$OUT/prefill_pyprofile.txt" python benchmarks/prefill_batch_bench.py mini --tokens 63 --states 1 --runs 3 \
  --pyprofile 45
