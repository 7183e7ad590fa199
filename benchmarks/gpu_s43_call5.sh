#!/usr/bin/env bash
# Session 43, call 5 (one H200): the router's gate GEMV and the router in one launch (kernels/gate_route.py, on by
# default in this tree, CPU-tested in the interpreter, never GPU-run): its CUDA tests with the dense, route and qgemv
# ones (dense's sums and qgemv's split reduction were refactored around it) and the replay tests; the gate on mini
# (the stream 96066ac1 unless a router weight's sum changed: the normalisation now adds the picks in order); decode_ab
# on and off at a Flash rank's shapes and on mini; the bench; the rank proxy's profile on the final tree.
# Usage: OUT=dir bash benchmarks/gpu_s43_call5.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 150 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -n 4 --dist loadfile -rfE -p pytest_failures \
  tests/test_gate_route.py tests/test_route_kernel.py tests/test_dense_kernel.py tests/test_qgemv.py \
  tests/test_replay_gpu.py -k "not few_heads and not unsupported"
step 110 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda \
  --ranks 1 --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini.txt"
step 120 "$OUT/decode_ab_flash.txt" python benchmarks/decode_ab_bench.py --preset flash --proxy-world 2 --steps 64 \
  --rounds 6 --arm off=gate_route.on=0
step 80 "$OUT/decode_ab_mini.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 6 \
  --arm off=gate_route.on=0
step 70 "$OUT/bench.txt" python -m dsv4.cli bench --preset mini --device cuda
step 100 "$OUT/proxy.txt" python benchmarks/rank_proxy.py --preset flash --world 2 --steps 64 --rows 3 \
  --eager-steps 8 --profile
