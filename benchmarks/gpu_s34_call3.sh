#!/usr/bin/env bash
# Session 34, call 3 (one H200, the warm machine of call 2, the same tree): what the session's changes buy, in one
# process each:
#   0. with the compressor's ticket_norm on (DSV4_POOL_TICKET_NORM=1, off by default: HCA's channel-split pool normed
#      and rotated by each window's last program): the replay and pool tests (graph == eager) and the gate on mini;
#   1. decode_ab_bench on mini: the defaults against the three switches off (compressor one_pass and pair, layout
#      xproj_first), against the batched step's ends in torch's ops (bookkeeping.batch_ends off) and against
#      ticket_norm on, graph and pipelined, ABBA;
#   2. kernel_table --sequence under the defaults;
#   3. the server on mini (concurrency 1 / 4 / 16 / 32, the batched steps' ends fused).
# Usage: OUT=dir bash benchmarks/gpu_s34_call3.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=25
step 120 "$OUT/pytest_replay_ticket.txt" env DSV4_POOL_TICKET_NORM=1 python -m pytest -q -p no:cacheprovider -n 2 \
  --dist loadfile --tb=short -rfE tests/test_replay_gpu.py tests/test_pool.py
step 100 "$OUT/gate_mini_ticket.txt" env DSV4_POOL_TICKET_NORM=1 python -m dsv4.cli gate --preset mini --device cuda \
  --ranks 1 --batch 4 --prime 64 --output 64 --out "$OUT/receipts-gate-mini-ticket.txt"
step 220 "$OUT/decode_ab.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm off3=compressor.one_pass=0,compressor.pair=0,layout.xproj_first=0 --arm ends_off=bookkeeping.batch_ends=0 \
  --arm ticket=compressor.ticket_norm=1
step 90 "$OUT/kernel_table.txt" python benchmarks/kernel_table.py --preset mini --device cuda --steps 16 --sequence \
  --top 40
step 150 "$OUT/serve_mini.txt" python benchmarks/serve_bench.py --preset mini --device cuda --prompt-tokens 64 \
  --max-tokens 64 --warmup 1
