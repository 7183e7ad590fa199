#!/usr/bin/env bash
# The next call on one H200 (<= 9.5 min), main's tree: DSV4_QGEMV_V3_SWAP=1 (session 25, off by default, never run on
# a GPU): v3's FP8 products with the operands swapped, the weight the A operand of a warpgroup MMA (HGMMA 64x16x16,
# A in registers; offline SASS of a Flash rank's wo_b: 19 barriers a program against v3's 35). Session 25's ncu: v3
# at 27 % of the DRAM peak, its 128-wide blocks through shared memory with 35 barriers a program. Other bits than v3
# (each row's still its own), so if it pays it needs the gate and the GPU suite before it is on by default.
#   1. its test on the GPU (each row alone == in a batch; the float64 reference);
#   2. qgemv_bench at 1 and 16 rows, v3 against swap / swap with 132 programs / swap with 128-output blocks
#      (bits_as_v3_default is false by design: rows_exact is the check);
#   3. ncu on it at a Flash rank's wo_b, one row;
#   4. the server's own 16-row step, profiled (pooled states, v3 for both GEMV families): session 25 call 6 profiled
#      plain states with the dense GEMVs on v2, not the server's step;
#   5. the server on mini with the swap, concurrency 1 and 16 (IDENTITY must hold).
# Usage: OUT=dir bash benchmarks/gpu_next.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 80 "$OUT/pytest_swap.txt" python -m pytest -q -p no:cacheprovider -rfE tests/test_qgemv.py -k "swap"
step 80 "$OUT/qgemv_swap.txt" python benchmarks/qgemv_bench.py --rows 1,16 --arms '^v3_(default|swap|swap_p132|swap_n128)$'
step 35 "$OUT/ncu_wo_b_swap.txt" ncu --clock-control none --kernel-name regex:qgemv3 --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
  python benchmarks/qgemv_one.py --n 4096 --k 4096 --rows 1 --set kernel=v3 --set v3_swap=1
step 120 "$OUT/batch_mini_pool.txt" env DSV4_QGEMV=v3 DSV4_DENSE_GEMV=v3 python benchmarks/batch_bench.py mini --pool \
  --sizes 1 16 --steps 32 --rows 3 --profile 16 --top 25
step 85 "$OUT/serve_mini_swap.txt" env DSV4_QGEMV_V3_SWAP=1 python benchmarks/serve_bench.py --preset mini \
  --device cuda --concurrency 1,16 --prompt-tokens 64 --max-tokens 64 --warmup 1
