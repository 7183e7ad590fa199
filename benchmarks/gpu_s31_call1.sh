#!/usr/bin/env bash
# Session 31's call 1 (one H200, <= 9 min): branch s31-pgraphs-on (s30-padded's padded prefill chunks, the prefill
# graphs on by default) with s30-review (moe_gl / qgemv_mma without the unused gluon import) and s31-v3rt (qgemv v3's
# row tiles a program, 1 by default: the restructured loop; tests/test_qgemv.py holds 2 and 4 to each row's bits):
# the GPU suite whole (tests/test_prefill_graphs.py's padded chunks against exact eager ones bit for bit, and every
# other CUDA test with the graphs on).
# Usage: OUT=dir bash benchmarks/gpu_s31_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
gpu_suite 480 "$OUT/pytest_gpu_suite.txt" --tb=short
