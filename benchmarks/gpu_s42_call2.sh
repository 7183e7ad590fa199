#!/usr/bin/env bash
# Session 42 call 2: where the graph arm's replay() host time goes (benchmarks/launch_probe.py), mini, one H200.
# Usage: OUT=dir bash benchmarks/gpu_s42_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=30
step 240 "$OUT/launch_probe.txt" python benchmarks/launch_probe.py --steps 64 --rounds 4
