#!/usr/bin/env bash
# Speculative decoding's first GPU run (written in session 46, which was lent no device; Model.verify is CPU-proven
# and refuses CUDA without DSV4_SPECULATIVE=1): its CUDA tests (verify rows == model.step's decode steps, bit for bit,
# on mini with the decode kernels and PDL), then what a verify step costs and yields against the plain step on mini
# and on a Flash rank (benchmarks/speculative_bench.py: every draft right, every draft wrong, k = 1, 3, 7), and the
# gate on mini at main's defaults (verify changes no default path: the stream 96066ac1 expected).
# Usage: OUT=dir bash benchmarks/gpu_speculative_call.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=12
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 150 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -rfE -p pytest_failures tests/test_speculative_gpu.py
DSV4_SPECULATIVE=1 step 100 "$OUT/spec_mini.txt" python benchmarks/speculative_bench.py --preset mini --k 1 --k 3 \
  --k 7 --steps 48 --rounds 3 --mtp
DSV4_SPECULATIVE=1 step 200 "$OUT/spec_flash.txt" python benchmarks/speculative_bench.py --preset flash \
  --proxy-world 2 --k 1 --k 3 --steps 32 --rounds 3
step 120 "$OUT/gate.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 --prime 64 \
  --output 64 --out "$OUT/receipts-gate.txt"
