#!/usr/bin/env bash
# Session 27 call 2 on one H200 (<= 8.5 min): the v2 family's FP8 GEMV in Gluon (dsv4/kernels/qgemv_gl.py,
# DSV4_QGEMV_GL=1, off by default, never run on a GPU before) and call 1's two same-bits defaults (moe_gl's
# shared_tokens 4, expert_groups' blocks form):
#   1. their tests: qgemv_gl against the reference, row by row, grouped, sliced, the second launch, graph == eager;
#      kernel 1's shared rows with 8 / 4 / 2 tokens a program; the groups' table in both forms;
#   2. qgemv_bench on a Flash rank's FP8 linears (world 2) and on mini's (world 1): v2 against the Gluon tiles;
#   3. mini's solo decode (dsv4 bench) with v2, then with the Gluon kernel at its default tiles and at 4 rows a thread;
#   4. the gate on mini with the Gluon kernel (eager == graph, the batch of 4 == solo, refusals).
# Usage: OUT=dir bash benchmarks/gpu_s27_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 75 "$OUT/pytest_gl.txt" python -m pytest -q -p no:cacheprovider -rfE tests/test_qgemv_gl.py \
  tests/test_expert_groups.py "tests/test_moe_gl.py::test_shared_expert_in_the_routed_launch"
SHAPES='^(wq_a|wq_b|wkv|wo_a|wo_b|indexer.wq_b|shared.w2)$'
step 100 "$OUT/qgemv_gl_flash.txt" python benchmarks/qgemv_bench.py --world 2 --shapes "$SHAPES" \
  --arms '^(v2_default|gl_.*)$'
step 90 "$OUT/qgemv_gl_mini.txt" python benchmarks/qgemv_bench.py --world 1 --shapes "$SHAPES" \
  --arms '^(v2_default|gl_.*)$'
BENCH="python -m dsv4.cli bench --preset mini --device cuda --prime 64 --steps 64 --rows 3"
step 60 "$OUT/bench_mini_v2.txt" $BENCH
step 60 "$OUT/bench_mini_gl.txt" env DSV4_QGEMV_GL=1 $BENCH
step 60 "$OUT/bench_mini_gl_r4.txt" env DSV4_QGEMV_GL=1 DSV4_QGEMV_GL_TILES=4,4,528,4 $BENCH
step 90 "$OUT/gate_mini_gl.txt" env DSV4_QGEMV_GL=1 python -m dsv4.cli gate --preset mini --device cuda --ranks 1 \
  --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini-gl.txt"
