#!/usr/bin/env bash
# For session 44 (written in session 43 with its device time spent; main's defaults are session 43 call 6's CUDA code):
#   1. moe CONFIG shared_lane at a Flash rank's shapes (call 8's Flash A/B was cut before its first row; mini -3 %);
#   2. the Flash rank proxy's kernel sequence on main (gate_route and ticket_norm on: 767 nodes), for the next lever;
#   3. the bench on mini.
# Usage: OUT=dir bash benchmarks/gpu_s44_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 200 "$OUT/decode_ab_flash.txt" python benchmarks/decode_ab_bench.py --preset flash --proxy-world 2 --steps 64 \
  --rounds 6 --arm lane=moe.shared_lane=1
step 150 "$OUT/proxy_seq.txt" python benchmarks/kernel_table.py --preset flash --proxy-world 2 --steps 4 \
  --top 40 --prime 32 --sequence
step 80 "$OUT/bench.txt" python -m dsv4.cli bench --preset mini --device cuda
