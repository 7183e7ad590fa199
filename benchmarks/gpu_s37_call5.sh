#!/usr/bin/env bash
# Session 37, call 5 (one H200), main's tree: the experts' kernels at Flash's per-rank shapes (moe_bench --world 2:
# rank 0's 128 local FP4 experts, the shared expert's rows 0..1,023), 1 and 16 tokens, against the copy bandwidth
# measured in the same run (issue 10's target 3: the expert kernels' fraction of it per Flash shape).
# Usage: OUT=dir bash benchmarks/gpu_s37_call5.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
step 150 "$OUT/moe_bench_flash.txt" python benchmarks/moe_bench.py --world 2 --tokens 1,16 --arms '^gl$' --calls 32
