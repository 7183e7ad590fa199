#!/usr/bin/env bash
# Session 35, call 1 (one H200): the kernels that start on their inputs before their PDL wait, where the model says the
# kernel before them wrote none of those inputs (all three switches off by default until this call measures them):
#   moe_gl down_early (DSV4_MOE_DOWN_EARLY: kernel 2's terms while the shared expert's down GEMV runs),
#   attention early (DSV4_ATTN_EARLY: the split programs' first tile of keys while q's norm and rope run),
#   compressor early (DSV4_POOL_EARLY: the pools while the latent's GEMV / norms run, the index keys' stored keys
#   while the pool runs); and the windows' geometry now made before q's latent (every arm).
#   1. their tests (bits equal to the plain launches, eager and in a graph), on CUDA under DSV4_PDL;
#   2. the replay and pool tests (graph == eager) with all three on;
#   3. decode_ab_bench on mini: the defaults against each switch and all three, graph and pipelined, ABBA.
# Usage: OUT=dir bash benchmarks/gpu_s35_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=25
EARLY="DSV4_MOE_DOWN_EARLY=1 DSV4_ATTN_EARLY=1 DSV4_POOL_EARLY=1"
step 200 "$OUT/pytest_early.txt" python -m pytest -q -p no:cacheprovider -n 3 --dist loadfile --tb=short -rfE \
  tests/test_moe_gl.py tests/test_attention_kernel.py tests/test_compressor_kernel.py -k "early"
step 150 "$OUT/pytest_replay_early.txt" env $EARLY python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile \
  --tb=short -rfE tests/test_replay_gpu.py tests/test_pool.py
step 240 "$OUT/decode_ab.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm down=moe_gl.down_early=1 --arm attn=attention.early=1 --arm pool=compressor.early=1 \
  --arm all=moe_gl.down_early=1,attention.early=1,compressor.early=1
