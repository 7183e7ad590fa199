#!/usr/bin/env bash
# For session 45 (written in session 44 with its device time spent; main's defaults are session 43's CUDA code):
#   1. moe_gl CONFIG solo_gate_up_splits (never GPU-run): its CUDA test, then decode_ab on a Flash rank and mini;
#   2. moe_gl CONFIG solo_gate_up_warps (session 44 call 7: a Flash rank +0.7 %, mini -0.5 %): both together;
#   3. the stamps of a Flash rank with the split (where kernel 1's ~10 us a program goes after it).
# Usage: OUT=dir bash benchmarks/gpu_s45_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 90 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures tests/test_moe_gl.py \
  -k "solo_splits or shared_early"
step 160 "$OUT/decode_ab_flash.txt" python benchmarks/decode_ab_bench.py --preset flash --proxy-world 2 --steps 64 \
  --rounds 4 --arm split2=moe_gl.solo_gate_up_splits=2 --arm w8=moe_gl.solo_gate_up_warps=8
step 60 "$OUT/decode_ab_mini.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm split2=moe_gl.solo_gate_up_splits=2
DSV4_MOE_GL_SOLO_SPLITS=2 step 90 "$OUT/moe_stamps_flash.txt" python benchmarks/moe_stamps.py --preset flash --world 2
# 4. (added in session 45) the mHC boundary's finish: the fused default at Sinkhorn iterations 1 / 10 / 20 (a
#    diagnostic: what the maps' serial chain costs of a boundary's ~8 us), and solo_gate_up_warps 8's CUDA tests.
step 90 "$OUT/hc_boundary_iters.txt" python benchmarks/hc_boundary_bench.py --rows 1 --arms 'fused_default' \
  --sinkhorn-iters 1,10,20
DSV4_MOE_GL_SOLO_WARPS=8 step 120 "$OUT/pytest_w8.txt" python -m pytest -q -p no:cacheprovider -rfE \
  -p pytest_failures tests/test_moe_gl.py
