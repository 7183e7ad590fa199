#!/usr/bin/env bash
# Session 43, call 3 (one H200): compressor CONFIG ticket_norm on by default (call 2: +0.7-0.9 % at a Flash rank's
# shapes, the same stream): the gate on mini (its stream must stay 96066ac1: the same bits), the compressor and replay
# GPU tests; then a second sweep of the kernels' CONFIG at a Flash rank's shapes (rank_proxy's model, decode_ab).
# Usage: OUT=dir bash benchmarks/gpu_s43_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 110 "$OUT/gate_mini.txt" python -m dsv4.cli gate --preset mini --device cuda \
  --ranks 1 --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini.txt"
step 150 "$OUT/pytest.txt" python -m pytest -q -p no:cacheprovider -n 3 --dist loadfile -rfE -p pytest_failures \
  tests/test_compressor_kernel.py tests/test_replay_gpu.py -k "not few_heads and not unsupported"
step 300 "$OUT/decode_ab_flash.txt" python benchmarks/decode_ab_bench.py --preset flash --proxy-world 2 --steps 64 \
  --rounds 6 --arm unroll2=moe_gl.mma_unroll=2 --arm dnreg0=moe_gl.solo_down_maxnreg=0 \
  --arm qprog528=qgemv.v2_programs=528 --arm qprog132=qgemv.v2_programs=132 --arm dk512=dense.block_k_bytes=512 \
  --arm dbn8=dense.block_n=8 --arm atiles2=attention.tiles=2 --arm topk4=topk.keys_per_thread=4 \
  --arm bw16=hc_boundary.num_warps=16 --arm noticket=compressor.ticket_norm=0
