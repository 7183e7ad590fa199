#!/usr/bin/env bash
# Session 20 call 3 (one H200), main's tree with two changes: the head's own K tiles (dsv4/kernels/dense.py
# CONFIG shape_tiles: 512-byte tiles for weights >= 256 MiB; DSV4_DENSE_SHAPE_TILES=0 the old 1,024) and the
# full-token graph's SamplingRows built before its capture (dsv4/replay.py: no fills replayed a token).
#   1. dense_bench on the head at one row, world 1 (mini's / Flash's whole head) and 2 (a Flash rank's slice):
#      the default (head tiles), flat (the old tiles) and two more head tilings;
#   2. the tests of the changed code on the GPU (dense kernel, replay graph == eager, generation, profile,
#      syncguard, sampler);
#   3. mini's bench under the defaults, and kernel_table --sequence (the head's advance, no fills);
#   4. where a 64-token prefill's time goes (eager_host_profile --prefill 64: wall vs kernels' time, cProfile).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s20_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
ARMS='kernel_(default|flat|head_k256B|head_k512B_n8)$'
step 45 "$OUT/dense_head_world1.txt" python benchmarks/dense_bench.py --world 1 --rows 1 --shapes '^head$' --arms "$ARMS"
step 40 "$OUT/dense_head_world2.txt" python benchmarks/dense_bench.py --world 2 --rows 1 --shapes '^head$' --arms "$ARMS"
step 150 "$OUT/pytest_changed.txt" python -m pytest -q -p no:cacheprovider -n 3 --dist loadfile -rfE \
  tests/test_dense_kernel.py tests/test_replay_gpu.py tests/test_generation_gpu.py tests/test_profile.py \
  tests/test_syncguard.py tests/test_sampler.py
step 110 "$OUT/bench_mini_default.txt" python -m dsv4.cli bench --preset mini --device cuda --ranks 1 --prime 64 \
  --steps 64 --rows 3
step 60 "$OUT/kernel_table_mini.txt" python benchmarks/kernel_table.py --preset mini --device cuda --steps 16 \
  --top 40 --sequence
left=$((540 - SECONDS))
[ $left -gt 40 ] && step $left "$OUT/prefill_host_mini.txt" python benchmarks/eager_host_profile.py --preset mini \
  --steps 8 --prefill 64 --top 30
