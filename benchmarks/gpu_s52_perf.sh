#!/usr/bin/env bash
# Session 52, after gpu_s52_mini.sh on an H200 (a Flash rank's weights need its memory): what the queue's levers
# save, every arm's stream checked against the plain one by the bench itself. gpu_s50_call1.sh's Flash rank with the
# fused Undo in the verify graphs, then gpu_s50_call3.sh's chunk arms (mini and a Flash rank) and the mma GEMVs.
# Usage: OUT=dir bash benchmarks/gpu_s52_perf.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
export DEADLINE_S=${DEADLINE_S:-560}
export DSV4_UNDO_FUSED=1 DSV4_UNDO_FUSED_CAPTURE=1
step 110 "$OUT/spec_mini_chunk.txt" python benchmarks/speculative_bench.py --preset mini --k 1 --k 3 --steps 32 \
  --rounds 3 --graph --fused-undo --chunk
step 150 "$OUT/spec_flash_chunk.txt" python benchmarks/speculative_bench.py --preset flash --proxy-world 2 --k 1 \
  --k 3 --steps 16 --rounds 2 --graph --fused-undo --chunk
DSV4_QGEMV=mma DSV4_DENSE_GEMV=v3 step 150 "$OUT/spec_flash_chunk_mma.txt" python benchmarks/speculative_bench.py \
  --preset flash --proxy-world 2 --k 3 --steps 16 --rounds 2 --graph --fused-undo --chunk
step 140 "$OUT/offline_mini.txt" python benchmarks/offline_bench.py --preset mini --device cuda --prompts 8 \
  --prompt-tokens 128 --max-tokens 32 --rounds 2
