#!/usr/bin/env bash
# For the next device, after gpu_s50_call1.sh (what is left of session 48's gpu_s49_call1.sh once session 49 ran its
# profile): the server's verify steps (serve_bench --speculate ngram under DSV4_SPECULATIVE=1, eager verify steps
# with the fused Undo; IDENTITY must hold, and the tok/s against the same run without --speculate says whether the
# scheduler's switch may go), then the conversation's time to first token per turn with the prefix cache (mini,
# chunk 256). Session 50 added the server's verify steps as graphs (DSV4_SERVE_VERIFY_GRAPHS=1) with the rows as one
# chunk (DSV4_VERIFY_CHUNK=1): best after gpu_s50_call3.sh has shown the chunk's bits on the GPU.
# Usage: OUT=dir bash benchmarks/gpu_s50_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
export DEADLINE_S=${DEADLINE_S:-570}
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests:$PWD"
step 120 "$OUT/serve_mini.txt" python benchmarks/serve_bench.py --preset mini --device cuda \
  --prompt-tokens 256 --max-tokens 64 --warmup 1 --concurrency 1,4
DSV4_SPECULATIVE=1 step 140 "$OUT/serve_mini_spec.txt" python benchmarks/serve_bench.py --preset mini --device cuda \
  --prompt-tokens 256 --max-tokens 64 --warmup 1 --concurrency 1,4 --speculate ngram --draft-tokens 3
# the same with the verify steps as graphs of their slots (serve CONFIG verify_graphs, session 50) and their rows as
# one chunk, the fused Undo in the graphs (each off by default)
DSV4_SPECULATIVE=1 DSV4_SERVE_VERIFY_GRAPHS=1 DSV4_VERIFY_CHUNK=1 DSV4_UNDO_FUSED=1 DSV4_UNDO_FUSED_CAPTURE=1 \
  step 140 "$OUT/serve_mini_spec_graphs.txt" python benchmarks/serve_bench.py --preset mini --device cuda \
  --prompt-tokens 256 --max-tokens 64 --warmup 1 --concurrency 1,4 --speculate ngram --draft-tokens 3
step 130 "$OUT/prefix_mini_256.txt" python benchmarks/prefix_cache_bench.py --preset mini --device cuda \
  --system 2048 --turns 6 --message 128 --reply 128 --chunk 256 --rows 4 --max-model-len 8192
