#!/usr/bin/env bash
# Session 40, call 5 (main with call 3's CUDA code + qgemv CONFIG v2_xq_tiles, off by default: the stacked wq_a + wkv
# in 8-row blocks of 2,048 inputs, 8 warps, split in two):
#   1. tests/test_graph_nodes.py (its kinds' assertion corrected after call 3) and test_qgemv's tile cases;
#   2. decode_ab_bench on mini: the defaults against xq=qgemv.v2_xq_tiles=1;
#   3. dsv4 bench on mini under the defaults (eager, graph, pipelined; the launches counted after the timed rows);
#   4. mini's graph kernels in sequence under the defaults (kernel_table.py; a profiler: last).
# Usage: OUT=dir bash benchmarks/gpu_s40_call5.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 100 "$OUT/pytest_nodes_tiles.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures \
  tests/test_graph_nodes.py tests/test_qgemv.py -k "graph_nodes or census or kernel_node or xq_tiles or shape_tiles"
step 180 "$OUT/decode_ab_xq.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm xq=qgemv.v2_xq_tiles=1
step 120 "$OUT/bench_mini.txt" python -m dsv4.cli bench --preset mini --device cuda
step 90 "$OUT/kernel_table.txt" python benchmarks/kernel_table.py --preset mini --steps 16 --sequence
