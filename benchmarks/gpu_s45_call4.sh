#!/usr/bin/env bash
# Session 45 call 4 (main's defaults: session 43's CUDA code): whether a routed expert's first read pays for address
# translation (benchmarks/tlb_probe.py), a Flash rank's chain as launched (kernel_table --sequence, read by
# benchmarks/chain_leads.py), and the gate on mini at the defaults.
# Usage: OUT=dir bash benchmarks/gpu_s45_call4.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=14
step 120 "$OUT/tlb_probe.txt" python benchmarks/tlb_probe.py
step 130 "$OUT/gate.txt" python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 --prime 64 \
  --output 64 --out "$OUT/receipts-gate.txt"
step 150 "$OUT/proxy_seq.txt" python benchmarks/kernel_table.py --preset flash --proxy-world 2 --steps 4 \
  --top 40 --prime 32 --sequence
python benchmarks/chain_leads.py "$OUT/proxy_seq.txt" --top 30 > "$OUT/chain_leads.txt" 2>&1
