#!/usr/bin/env bash
# Session 43, call 2 (one H200): the kernels' CONFIG, tuned on mini, re-measured at a Flash rank's shapes
# (benchmarks/rank_proxy.py's model: rank 0 of 2 alone, decode_ab's arms interleaved in one process), then the
# proxy's kernel sequence of one graph token (which kernel follows which, each one's advance).
# Usage: OUT=dir bash benchmarks/gpu_s43_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 330 "$OUT/decode_ab_flash.txt" python benchmarks/decode_ab_bench.py --preset flash --proxy-world 2 --steps 64 \
  --rounds 6 --arm ticket=compressor.ticket_norm=1 --arm attn32=attention.block_n=32 \
  --arm fusedc=attention.fused_combine=1 --arm bd64=hc_boundary.block_d=64 --arm bw4=hc_boundary.num_warps=4 \
  --arm dprog528=dense.programs=528 --arm early1=qgemv.v2_early_tiles=1 --arm rpt2=moe_gl.rows_per_thread=2 \
  --arm route4=route.num_warps=4
step 150 "$OUT/proxy_seq.txt" python benchmarks/kernel_table.py --preset flash --proxy-world 2 --steps 4 \
  --top 40 --prime 32 --sequence
