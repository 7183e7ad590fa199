#!/usr/bin/env bash
# Session 10 call 3 (nvidia-h200-x2, <= 9.5 min), branch s10 = main + p2p + pdlw: the p2p all-reduce (microbench and
# its 2-rank GPU test), DSV4_PDL=1 under the replay and pool tests (GPU 0) beside the side lane's test (GPU 1), then
# flash decode, 2 rows of 64, one arm per switch: defaults, DSV4_PDL=1, DSV4_REDUCE=p2p, DSV4_OVERLAP=1.
# Every step has a limit and runs in its own process group (a p2p protocol bug hangs rather than fails).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s10_call3.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
step 75 "$OUT/allreduce.txt" env DSV4_KERNELS=triton python benchmarks/allreduce_bench.py --p2p-ctas 4,8,16
step 100 "$OUT/pytest_p2p_gpu.txt" env DSV4_KERNELS=triton python -m pytest -q -p no:cacheprovider tests/test_p2p_gpu.py
step 160 "$OUT/pytest_pdl.txt" env CUDA_VISIBLE_DEVICES=0 DSV4_PDL=1 python -m pytest -q -p no:cacheprovider \
  tests/test_replay_gpu.py tests/test_pool.py &
step 160 "$OUT/pytest_lanes.txt" env CUDA_VISIBLE_DEVICES=1 python -m pytest -q -p no:cacheprovider tests/test_lanes.py &
wait
arm() {  # arm NAME ENV...
  local name=$1; shift
  step 75 "$OUT/bench_flash_$name.txt" env "$@" python -m dsv4.cli bench --preset flash --device cuda --ranks 2 \
    --prime 64 --steps 64 --rows 2
}
arm default DSV4_PDL=0
arm pdl DSV4_PDL=1
arm p2p DSV4_REDUCE=p2p DSV4_KERNELS=triton
arm overlap DSV4_OVERLAP=1
