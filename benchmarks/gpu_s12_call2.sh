#!/usr/bin/env bash
# Session 12 call 2 (nvidia-h200, one GPU, <= 10 min): the pipelined batched steps (engine.step_batch_launch /
# step_batch_settle; the batched step's graph now reads the device hold and the fed inputs) and the server's
# pipelined rounds.
#   1. test_replay_gpu (graph == eager; batched graph == solo graphs; pipelined batched graph == solo graphs) and
#      test_pool (pooled == solo, refusals, no host sync) under the defaults;
#   2. serve_host on mini, v3: the scheduler's rounds pipelined against unpipelined, 1 and 16 sequences, beside
#      Model.step's graph and the bucket graphs alone;
#   3. serve_bench on mini, v3, concurrency 1 and 16 (identity of each request alone and among others);
#   4. the gate on mini, --batch 4 (prime 64, output 64): the batched step's new graph through the gate.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s12_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=14
step 200 "$OUT/pytest_replay_pool.txt" python -m pytest -q -p no:cacheprovider tests/test_replay_gpu.py tests/test_pool.py
step 100 "$OUT/serve_host_mini_v3.txt" python benchmarks/serve_host.py --preset mini --device cuda --gemv v3 \
  --steps 64 --rows 3 --seqs 16 --top 30
step 110 "$OUT/serve_mini_v3.txt" python benchmarks/serve_bench.py --preset mini --device cuda --gemv v3 \
  --concurrency 1,16 --prompt-tokens 64 --max-tokens 64
step 100 "$OUT/gate_mini_64.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 \
  --prime 64 --output 64 --out "$OUT/receipts_gate_mini_64.txt"
