#!/usr/bin/env bash
# Session 52, while no H200 came: what of the queue needs only mini (correctness; an H100 runs it as an H200 would),
# in two lanes at once (each builds mini, ~22 GB), so one call holds three queued checks:
# lane 1: gpu_s50_call1.sh's checks (the fused Undo, its capture on, through the gate's speculative check, test_undo,
#         the speculative GPU file with the pad case), then gpu_s50_call3.sh's tests with DSV4_VERIFY_CHUNK=1;
# lane 2: gpu_s51_serve_checks.sh (the grammar's device-side masks; the scored prefill), then call3's gate with the
#         chunk. The timings of these steps share the GPU with the other lane: read them as checks, not costs.
# Usage: OUT=dir bash benchmarks/gpu_s52_mini.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
export DEADLINE_S=${DEADLINE_S:-560}
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests:$PWD"
(
  export DSV4_UNDO_FUSED=1 DSV4_UNDO_FUSED_CAPTURE=1
  step 120 "$OUT/gate_spec.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 --prime 64 \
    --output 64 --speculative 3 --out "$OUT/receipts-gate-spec.txt"
  FAILURES_FILE="$OUT/failures_undo.txt" step 180 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -rfE \
    -p pytest_failures tests/test_undo.py tests/test_speculative_gpu.py
  DSV4_VERIFY_CHUNK=1 FAILURES_FILE="$OUT/failures_chunk.txt" step 200 "$OUT/pytest_chunk.txt" python -m pytest -q \
    -p no:cacheprovider -rfE -p pytest_failures tests/test_verify_chunk.py tests/test_speculative_gpu.py
) &
lane1=$!
(
  step 150 "$OUT/sampling_check_masks.txt" python benchmarks/sampling_check.py --preset mini --device cuda --rows 4 \
    --steps 24
  DSV4_UNCHECKED_SAMPLING=1 step 140 "$OUT/score_check_mini.txt" python benchmarks/score_check.py --preset mini \
    --device cuda --tokens 600 --chunk 256
  DSV4_UNDO_FUSED=1 DSV4_UNDO_FUSED_CAPTURE=1 DSV4_VERIFY_CHUNK=1 step 120 "$OUT/gate_spec_chunk.txt" \
    python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 --prime 64 --output 64 --speculative 3 \
    --out "$OUT/receipts-gate-spec-chunk.txt"
) &
lane2=$!
wait $lane1 $lane2
nvidia-smi --query-gpu=memory.used,memory.total --format=csv > "$OUT/zz_memory.txt" 2>&1
