#!/usr/bin/env bash
# Session 39, call 2: qgemv v2's FP8 tile loop software-pipelined through shared memory (CONFIG v2_stages,
# DSV4_QGEMV_STAGES, off by default: Triton's cp.async stages; the same products in the same order, so the same bits
# at the same tiles; at the default tiles only mini's wo_a loops over more than two tiles), and programs that stream
# a whole row block's K through the stages (other bits).
#   1. tests/test_qgemv.py -k tile_loop_forms: loop, unrolled and pipelined bit for bit on the GPU;
#   2. qgemv_bench on wo_a / wo_b, world 1 (mini's shapes) and world 2 (a Flash rank's): the defaults, stages 2-4
#      (bit-equal twins of the defaults) and the streaming tiles;
#   3. decode_ab_bench on mini: the defaults against stages 3 and 4 (the defaults' stream expected).
# Usage: OUT=dir bash benchmarks/gpu_s39_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 90 "$OUT/pytest_stages.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures tests/test_qgemv.py \
  -k "tile_loop_forms or early_tile"
ARMS='^v2_(default|stages[234]|n(8|16|32)_k(512|1024)_s[12]_st[346])$'
step 150 "$OUT/qgemv_world1.txt" python benchmarks/qgemv_bench.py --world 1 --shapes '^wo_' --arms "$ARMS"
step 150 "$OUT/qgemv_world2.txt" python benchmarks/qgemv_bench.py --world 2 --shapes '^wo_' --arms "$ARMS"
step 150 "$OUT/decode_ab.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm st3=qgemv.v2_stages=3 --arm st4=qgemv.v2_stages=4
