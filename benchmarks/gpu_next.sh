#!/usr/bin/env bash
# The next call on one H200 (<= 9.5 min), main's tree: DSV4_MOE_SHARED_PREFILL_TILES=1 (session 22, off by default:
# a short prefill chunk's shared expert as two v3 GEMVs instead of the fused CUDA-core kernel; other bits, the same
# alone and grouped, the gate PASSED with it in session 22 call 3). Session 22 call 5 measured a 64-token prefill on
# mini 17.5 -> 23.2 ms with it on, where the 16 x 63 wave's profile (call 2) put the fused kernel at 28.3 of 95 ms:
# why one chunk is slower is not known (a GEMV leaving v3 for a row-by-row fallback would explain it).
#   1. one 63-token chunk's kernels, on and off (prefill_batch_bench --states 1 --profile 25);
#   2. the 16 x 63 wave, on and off (call 5 cut the on arm at 50 s: compiles; 120 s here);
#   3. mini's prefill at 64 / 128 tokens, on and off.
# If on wins both the chunk and the wave: the default (its bits are new: the gate and the GPU suite again).
# Then DSV4_MOE_TC_WAVE_TILES=1 (session 22, off by default, never run on a GPU): a grouped wave's routed experts in
# the long chunks' tiles by the wave's pairs per expert (32 rows at 16 x 63); the same bits by construction:
#   4. its test on the GPU (the wave == the fixed shape == each token alone, torch.equal);
#   5. the 16 x 63 wave with it: its digest must be the off arm's (step 2's), its time below it.
# If both hold: on by default (the same bits: its test and the suite), and the server's warm-up then also needs a
# wave of each tile shape a wave reaches (not written yet: a first concurrency-16 wave compiles the 32-row tiles).
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_next.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 70 "$OUT/prefill_chunk_on.txt" env DSV4_MOE_SHARED_PREFILL_TILES=1 python benchmarks/prefill_batch_bench.py \
  mini --states 1 --tokens 63 --runs 3 --profile 25
step 50 "$OUT/prefill_chunk_off.txt" python benchmarks/prefill_batch_bench.py mini --states 1 --tokens 63 --runs 3 \
  --profile 25
step 120 "$OUT/prefill_wave_on.txt" env DSV4_MOE_SHARED_PREFILL_TILES=1 python benchmarks/prefill_batch_bench.py \
  mini --states 16 --tokens 63 --runs 3 --profile 12
step 60 "$OUT/prefill_wave_off.txt" python benchmarks/prefill_batch_bench.py mini --states 16 --tokens 63 --runs 3
step 50 "$OUT/prefill_on.txt" env DSV4_MOE_SHARED_PREFILL_TILES=1 python benchmarks/prefill_bench.py mini \
  --sizes 64 128 --runs 5 --eager-steps 0 --graph-steps 0 --no-hf
step 50 "$OUT/prefill_off.txt" python benchmarks/prefill_bench.py mini --sizes 64 128 --runs 5 --eager-steps 0 \
  --graph-steps 0 --no-hf
step 40 "$OUT/pytest_wave_tiles.txt" python -m pytest -q -p no:cacheprovider -rfE tests/test_moe_tc.py -k wave
step 60 "$OUT/prefill_wave_tiles.txt" env DSV4_MOE_TC_WAVE_TILES=1 python benchmarks/prefill_batch_bench.py mini \
  --states 16 --tokens 63 --runs 3 --profile 12
