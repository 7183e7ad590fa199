#!/usr/bin/env bash
# The next call on nvidia-h200-x2 (<= 10 min), main's tree: what sessions 10-12 built and could not run on two
# ranks (only one H200 was lent from session 10's call 3 on).
#   1. the replay and pool tests and the pipelined batched graph on two ranks' worth of code paths (one GPU each
#      process: test_replay_gpu + test_pool run on rank-local mini);
#   2. flash decode, 3 rows of 64, under the defaults, then DSV4_PDL=1 (issue 10: PDL on by default if it pays);
#   3. the server on flash, v3, pipelined rounds, steady state (--warmup 1), concurrency 1 and 16 (issue 12's
#      targets: c=1 within 10 % of the solo graph of 2., c=16 >= 8 x c=1), with the identity check.
# Then, in a call of its own: benchmarks/gpu_flash_gate.sh (the gate on flash at 256/256).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_x2_next.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=14
step 120 "$OUT/pytest_replay_pool.txt" python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py
for pdl in 0 1; do
  step 100 "$OUT/bench_flash_pdl$pdl.txt" env DSV4_PDL=$pdl python -m dsv4.cli bench --preset flash --device cuda \
    --ranks 2 --prime 64 --steps 64 --rows 3
done
step 230 "$OUT/serve_flash_v3.txt" python benchmarks/serve_bench.py --preset flash --ranks 2 --device cuda \
  --gemv v3 --concurrency 1,16 --prompt-tokens 64 --max-tokens 64 --warmup 1
