#!/usr/bin/env bash
# Speculative decoding's first GPU run (written in session 46, which was lent no device; Model.verify, verify_draft
# and replay.VerifyReplay are CPU-proven (the graph not at all: CUDA only) and refuse CUDA without
# DSV4_SPECULATIVE=1): their CUDA tests (verify rows == model.step's decode steps, bit for bit, eager and as a graph;
# the MTP-drafted stream == the plain one, on mini), then what a verify step costs and yields against the plain step
# on mini and on a Flash rank (benchmarks/speculative_bench.py: every draft right, every draft wrong, the MTP layer's
# drafts, k = 1 and 3, eager and as graphs, the plain step's replay beside them; on mini with the head zeroed, so the
# MTP layer's drafts are always right and its arms show full acceptance with its cost, on the Flash rank as is; each
# verify arm also with its writes by kernels/undo.py, CONFIG fused: arms *_fu). Last, the gate's speculative check
# (dsv4 gate --speculative 3: verify steps, as graphs, against the plain steps byte for byte, and a refusal inside). First the gate on mini at main's
# defaults: session 46 changed default-path Python (attention/forward/state/engine plumbing for verify and the MTP
# layer, the same kernels and launches), so the stream 96066ac1 / 1fd7a9bb must hold.
# Usage: OUT=dir bash benchmarks/gpu_speculative_call.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 110 "$OUT/gate.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 --prime 64 \
  --output 64 --out "$OUT/receipts-gate.txt"
step 160 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures tests/test_speculative_gpu.py \
  tests/test_undo.py
DSV4_SPECULATIVE=1 step 100 "$OUT/spec_mini.txt" python benchmarks/speculative_bench.py --preset mini --k 1 --k 3 \
  --steps 32 --rounds 2 --mtp --graph --zero-head --fused-undo
DSV4_SPECULATIVE=1 step 150 "$OUT/spec_flash.txt" python benchmarks/speculative_bench.py --preset flash \
  --proxy-world 2 --k 1 --steps 16 --rounds 2 --mtp --graph --fused-undo
step 60 "$OUT/gate_speculative.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --prime 32 \
  --output 32 --speculative 3 --out "$OUT/receipts-gate-speculative.txt"
