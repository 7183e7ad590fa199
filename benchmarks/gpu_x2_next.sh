#!/usr/bin/env bash
# The next call on nvidia-h200-x2 (<= 10 min), main's tree: what sessions 10-17 built and could not run on two ranks
# (only one H200 was lent from session 10's call 3 on; the replay and pool tests ran on one GPU in session 15).
#   1. flash decode, 3 rows of 64: the defaults (moe_gl's experts on the tensor cores, the GEMV's tiles by shape and
#      unrolled loop, the step kernels), DSV4_MOE_MMA=0 (moe_gl on the CUDA cores: what session 16's tensor-core
#      programs give on Flash), the step kernels off (DSV4_ROPE_TABLE=0 DSV4_STEP_BOOKKEEPING=0: what session 17's
#      glue cut gives), the GEMV as session 14 left it (DSV4_QGEMV_SHAPE_TILES=0 DSV4_QGEMV_UNROLL=0: what sessions
#      15 and 17's tiles give on two ranks), DSV4_PDL=0 (session 18 made PDL the default, every kernel under it: what
#      it gives on two ranks, where collectives sit between the kernels), DSV4_HC_HEAD=0;
#      Each bench has session 19's pipelined arm (the one-row batch graph with one step in flight, over 2 ranks: its
#      first GPU run; generation.py takes it on one GPU only until it passes here, with tests/test_generation_gpu.py's
#      two-rank case, the last step below);
#   2. the server on flash, v3, pipelined rounds, steady state (--warmup 1), concurrency 1 and 16 (issue 12's
#      targets: c=1 within 10 % of the solo graph of 1., c=16 >= 8 x c=1), with the identity check, its compiles
#      logged (DSV4_LOG_COMPILES=1: a request waiting on one names it).
# Then, in a call of its own: benchmarks/gpu_flash_gate.sh (the gate on flash at 256/256).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_x2_next.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=14
for arm in "DSV4_MOE_GLUON=1" "DSV4_MOE_MMA=0" "DSV4_ROPE_TABLE=0 DSV4_STEP_BOOKKEEPING=0" \
    "DSV4_QGEMV_SHAPE_TILES=0 DSV4_QGEMV_UNROLL=0" "DSV4_PDL=0" "DSV4_HC_HEAD=0"; do
  name=${arm//=/}
  step $([ "$arm" = DSV4_MOE_GLUON=1 ] && echo 110 || echo 60) "$OUT/bench_flash_${name// /_}.txt" env $arm python -m dsv4.cli bench --preset flash --device cuda \
    --ranks 2 --prime 64 --steps 64 --rows 3
done
left=$((520 - SECONDS))  # the server with what is left (or a call of its own)
[ $left -gt 60 ] && step $left "$OUT/serve_flash_v3.txt" env DSV4_LOG_COMPILES=1 python benchmarks/serve_bench.py --preset flash --ranks 2 \
  --device cuda --gemv v3 --concurrency 1,16 --prompt-tokens 64 --max-tokens 64 --warmup 1
step 60 "$OUT/pytest_generation_two_ranks.txt" python -m pytest -q -p no:cacheprovider tests/test_generation_gpu.py \
  -k two_ranks
