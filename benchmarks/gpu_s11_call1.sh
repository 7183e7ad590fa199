#!/usr/bin/env bash
# Session 11 call 1 (nvidia-h200, one GPU, <= 9 min), branch fsamp: the sampler's token in two launches
# (dsv4/kernels/sample.py, GPU_CHECKED on the branch) and the kept-set sort only for rows with top_k / top_p.
#   1. the sampler's CUDA tests (the kernel against the float64 definition and the reference, a row alone == among
#      others, greedy across chunks, the frequencies over 4,000 draws) and the CPU ones beside them;
#   2. test_replay_gpu + test_pool under the defaults (graph == eager with the new kernels in the graph, pooled ==
#      solo, restricted rows in a batch);
#   3. mini decode, 1 rank, 3 rows of 128: main's tree (_base, carried untracked) then the branch, ABA, and the
#      branch with --profile (the sampler phase against session 10's 248 us).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s11_call1.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=25
step 110 "$OUT/pytest_sampler.txt" python -m pytest -q -p no:cacheprovider tests/test_sample_kernel.py \
  tests/test_sampler.py tests/test_draw_kernel.py tests/test_processing.py
step 200 "$OUT/pytest_replay_pool.txt" python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py
mini() {  # mini NAME DIR [ARGS...]
  local name=$1 dir=$2; shift 2
  step 55 "$OUT/bench_mini_$name.txt" env -C "$dir" PYTHONPATH="$PWD/$dir" python -m dsv4.cli bench --preset mini \
    --device cuda --prime 64 --steps 128 --rows 3 "$@"
}
mini a_base _base
mini b_fsamp .
mini c_base _base
mini d_fsamp_profile . --profile
