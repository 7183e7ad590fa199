#!/usr/bin/env bash
# Session 17 call 1 (nvidia-h200, one GPU, <= 9 min): qgemv v2's FP8 tile loop without the carried tile (the first
# tile summed before the loop: ~3 byte permutes a weight fewer in wo_a's and wo_b's loops, SASS counted), the loop
# unrolled, and splits / row blocks for the looping shapes: qgemv_bench per Flash shape, world 1 (mini's) then 2;
# test_qgemv's CUDA cases (the loop's forms equal bit for bit); test_moe_gl's cases edited after session 16's last call.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s17_call1.sh
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
SHAPES='^(wq_a|wq_b|wkv|wo_a|wo_b|indexer.wq_b|shared.w2)$'
step 200 "$OUT/qgemv_world1.txt" python benchmarks/qgemv_bench.py --world 1 --shapes "$SHAPES" --arms '^v2_'\
'(default|flat|unroll|flat_unroll|k1024|k1024_unroll|k1024_p2048|k1024_p4096|k512_p2048|k512_p4096|n32_k512_p2048|'\
'n32_k1024_p2048|n64_k512_p2048|n32_k1024_w8_p2048|n32_k1024_unroll)$'
step 100 "$OUT/pytest_qgemv.txt" python -m pytest -q -x -p no:cacheprovider tests/test_qgemv.py
step 90 "$OUT/pytest_moe_gl.txt" python -m pytest -q -p no:cacheprovider tests/test_moe_gl.py
left=$((535 - SECONDS))
if [ $left -gt 40 ]; then
  step $left "$OUT/qgemv_world2.txt" python benchmarks/qgemv_bench.py --world 2 --shapes "$SHAPES" --arms '^v2_'\
'(default|unroll|k1024_p2048|k512_p2048|n32_k512_p2048|n32_k1024_p2048|n64_k512_p2048|n32_k1024_unroll)$'
fi
