#!/usr/bin/env bash
# Session 42 call 4: the route kernel in 1 or 2 warps (route CONFIG num_warps), the attention combine a program per
# chunk of columns (attention CONFIG combine_split_d, DSV4_ATTN_COMBINE_SPLIT_D), tiles of 32 keys again; their GPU
# tests first. Usage: OUT=dir bash benchmarks/gpu_s42_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 200 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile -rfE -p pytest_failures \
  tests/test_attention_kernel.py tests/test_route_kernel.py -k "combine_split or route or tensor_core or bfloat16"
step 240 "$OUT/decode_ab.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 6 \
  --arm r1=route.num_warps=1 --arm r2=route.num_warps=2 --arm csd=attention.combine_split_d=1 \
  --arm n32=attention.block_n=32 --arm all=route.num_warps=1,attention.combine_split_d=1,attention.block_n=32
