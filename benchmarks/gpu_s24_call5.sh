#!/usr/bin/env bash
# Session 24 call 5 (one H200): v3's launch options at one and 16 rows (call 4: v3 at one row 55.3 us a Flash layer's
# FP8 linears against v2's 42.2, flat from 1 to 16 rows at ~0.32 of the bandwidth: the server's GEMVs). Warps and
# software-pipeline stages leave each sum's order; bits_as_v3_default says whether an arm keeps v3's bits.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s24_call5.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=20
step 150 "$OUT/qgemv_v3_options.txt" python benchmarks/qgemv_bench.py --rows 1,16 --arms '^v3_(default|w8|s2|s3|s4|w8_s3|n64_s3)$'  # (the stage arms and v3_num_stages were removed after this call)
