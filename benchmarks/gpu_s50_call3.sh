#!/usr/bin/env bash
# For the next device, after gpu_s50_call1.sh (written in session 50, no device lent): a verify step's rows as one
# chunk (layout CONFIG verify_chunk, off by default: DSV4_VERIFY_CHUNK=1), with the fused Undo on (its switches, as
# call 1 leaves them if it passes). Its kernel's rows against the decode kernel on CUDA (test_verify_chunk's CUDA
# cases), the speculative GPU file (verify graphs, MTP, pad) and the gate's speculative check with it on; then what it
# saves: speculative_bench's arms *_fu (rows in turn) against *_ch (one chunk) in one process, mini and a Flash rank.
# If the tests and the gate pass with every stream the plain one: verify_chunk on by default.
# Usage: OUT=dir bash benchmarks/gpu_s50_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=16
export DEADLINE_S=${DEADLINE_S:-570}
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests:$PWD"
export DSV4_UNDO_FUSED=1 DSV4_UNDO_FUSED_CAPTURE=1
DSV4_VERIFY_CHUNK=1 step 150 "$OUT/pytest_chunk.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures \
  tests/test_verify_chunk.py tests/test_speculative_gpu.py
DSV4_VERIFY_CHUNK=1 step 90 "$OUT/gate_spec_chunk.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 \
  --batch 4 --prime 64 --output 64 --speculative 3 --out "$OUT/receipts-gate-spec-chunk.txt"
step 110 "$OUT/spec_mini_chunk.txt" python benchmarks/speculative_bench.py --preset mini --k 1 --k 3 --steps 32 \
  --rounds 3 --graph --fused-undo --chunk
step 150 "$OUT/spec_flash_chunk.txt" python benchmarks/speculative_bench.py --preset flash --proxy-world 2 --k 3 \
  --steps 16 --rounds 2 --graph --fused-undo --chunk
# The decode GEMVs as mma (m16n8k16 with the rows as columns: a row costs what eight do; other bits than v2's, so its
# own plain arms): does a verify step's FP8 work (3.25 ms for 4 rows against 1.38 for one on v2, session 49) shrink
# more than the plain step grows?
DSV4_QGEMV=mma DSV4_DENSE_GEMV=v3 step 150 "$OUT/spec_flash_chunk_mma.txt" python benchmarks/speculative_bench.py \
  --preset flash --proxy-world 2 --k 3 --steps 16 --rounds 2 --graph --fused-undo --chunk
