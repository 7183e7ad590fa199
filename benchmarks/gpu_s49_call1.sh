#!/usr/bin/env bash
# For the next device (written in session 48, whose device time ran out on refused starts): why a verify step costs
# 2.5-5 plain steps (session 48 call 2): speculative_bench on mini with the head zeroed, each verify graph's kernel
# nodes beside the plain graph's, and a torch.profiler table of eager verify steps (3 drafts) against plain steps by
# kernel name (--profile: last, a profiler session slows later launches); the same arms on a Flash rank; then the
# server's verify steps (serve_bench --speculate ngram under DSV4_SPECULATIVE=1: IDENTITY must hold; it lifts the
# scheduler's switch), then the conversation's time to first token per turn with the prefix cache (mini, chunk 256).
# Superseded: session 49 ran its profile steps (gpu_s49_callA.sh); the rest is gpu_s50_call2.sh.
# Usage: OUT=dir bash benchmarks/gpu_s49_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
export DEADLINE_S=${DEADLINE_S:-540}
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests:$PWD"
step 120 "$OUT/spec_mini.txt" python benchmarks/speculative_bench.py --preset mini --k 1 --k 3 --steps 32 --rounds 2 \
  --graph --zero-head --profile 3
step 150 "$OUT/spec_flash.txt" python benchmarks/speculative_bench.py --preset flash --proxy-world 2 --k 1 --k 3 \
  --steps 16 --rounds 2 --graph --profile 3
DSV4_SPECULATIVE=1 step 120 "$OUT/serve_mini_spec.txt" python benchmarks/serve_bench.py --preset mini --device cuda \
  --prompt-tokens 256 --max-tokens 64 --warmup 1 --concurrency 1,4 --speculate ngram --draft-tokens 3
step 150 "$OUT/prefix_mini_256.txt" python benchmarks/prefix_cache_bench.py --preset mini --device cuda \
  --system 2048 --turns 6 --message 128 --reply 128 --chunk 256 --rows 4 --max-model-len 8192
