#!/usr/bin/env bash
# Session 37, call 3 (the warm machine of call 2, the same tree): the GPU suite's kernel half, every test's seconds
# recorded, then decode_ab_bench on mini: the final defaults against shared_early off (the prefetch alone).
# Usage: OUT=dir bash benchmarks/gpu_s37_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=25
export FAILURES_FILE="$OUT/failures.txt" DURATIONS_FILE="$OUT/durations.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
gpu_suite_of "$GPU_SUITE_KERNEL_FILES" 450 "$OUT/pytest_gpu_kernels.txt" -p pytest_failures
step 100 "$OUT/decode_ab.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm late=moe_gl.shared_early=0
