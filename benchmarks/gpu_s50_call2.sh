#!/usr/bin/env bash
# For the next device, after gpu_s50_call1.sh (what is left of session 48's gpu_s49_call1.sh once session 49 ran its
# profile): the server's verify steps (serve_bench --speculate ngram under DSV4_SPECULATIVE=1, eager verify steps
# with the fused Undo; IDENTITY must hold, and the tok/s against the same run without --speculate says whether the
# scheduler's switch may go), then the conversation's time to first token per turn with the prefix cache (mini,
# chunk 256).
# Usage: OUT=dir bash benchmarks/gpu_s50_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
export DEADLINE_S=${DEADLINE_S:-540}
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests:$PWD"
step 120 "$OUT/serve_mini.txt" python benchmarks/serve_bench.py --preset mini --device cuda \
  --prompt-tokens 256 --max-tokens 64 --warmup 1 --concurrency 1,4
DSV4_SPECULATIVE=1 step 140 "$OUT/serve_mini_spec.txt" python benchmarks/serve_bench.py --preset mini --device cuda \
  --prompt-tokens 256 --max-tokens 64 --warmup 1 --concurrency 1,4 --speculate ngram --draft-tokens 3
step 150 "$OUT/prefix_mini_256.txt" python benchmarks/prefix_cache_bench.py --preset mini --device cuda \
  --system 2048 --turns 6 --message 128 --reply 128 --chunk 256 --rows 4 --max-model-len 8192
