#!/usr/bin/env bash
# For the next device (written in session 49, whose device time ran out): the fused Undo (off by default; GPU-run in
# session 49 call D), switched on for the whole call, through the gate's speculative check (verify graphs against the plain steps, a refusal inside
# one); the whole speculative GPU file (MTP included) and with DSV4_VERIFY_PAD=1 (speculative CONFIG pad: short
# proposals padded to k, the verify graph replayed); its cost on a Flash rank (session 49 call D was cut before it);
# offline_bench at the defaults (gc_hold on) with room for its per-prompt captures.
# Usage: OUT=dir bash benchmarks/gpu_s50_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
export DEADLINE_S=${DEADLINE_S:-570}
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests:$PWD"
export DSV4_UNDO_FUSED=1 DSV4_UNDO_FUSED_CAPTURE=1  # if all of this passes: both on by default
step 90 "$OUT/gate_spec.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 --prime 64 \
  --output 64 --speculative 3 --out "$OUT/receipts-gate-spec.txt"
step 130 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures tests/test_undo.py \
  tests/test_speculative_gpu.py
# (test_speculative_gpu.py holds the pad case on CUDA: test_ngram_stream_on_cuda[padded_graph])
step 150 "$OUT/spec_flash.txt" python benchmarks/speculative_bench.py --preset flash --proxy-world 2 --k 1 --k 3 \
  --steps 16 --rounds 2 --graph --fused-undo
step 140 "$OUT/offline_mini.txt" python benchmarks/offline_bench.py --preset mini --device cuda --prompts 8 \
  --prompt-tokens 128 --max-tokens 32 --rounds 2
