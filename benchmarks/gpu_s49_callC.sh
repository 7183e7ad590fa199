#!/usr/bin/env bash
# Session 49 call C: call B showed the verify graph with the fused Undo still faults with its tables kept (and every
# address baked in its tables in a live block or the graph's own pool). Which kernel, under which condition: tiny and
# mini, the fused apply alone, the fused take-back alone, PDL off; compute-sanitizer's memcheck on tiny if the image
# has it. Each arm its own process (a fault takes the CUDA context).
# Usage: OUT=dir bash benchmarks/gpu_s49_callC.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=14
export DEADLINE_S=${DEADLINE_S:-570}
D="python benchmarks/undo_capture_diag.py --arm keep"
{ which compute-sanitizer; ls -d /usr/local/cuda*/bin 2>&1; nvcc --version 2>&1 | tail -1; } > "$OUT/tools.txt" 2>&1
step 60 "$OUT/tiny_both.txt" $D --preset tiny --rows 2
step 60 "$OUT/mini_apply.txt" $D --preset mini --variant apply
step 60 "$OUT/mini_back.txt" $D --preset mini --variant back
DSV4_PDL=0 step 60 "$OUT/mini_both_nopdl.txt" $D --preset mini
DSV4_FAST_LAUNCH=0 step 60 "$OUT/mini_both_nofast.txt" $D --preset mini
CS=$(which compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$CS" ]; then
  step 170 "$OUT/sanitizer_tiny.txt" "$CS" --tool memcheck --print-limit 20 $D --preset tiny --rows 2
fi
# call A's offline_bench was cut at 80 s with no output on a cold Triton cache: again, warm, with more time
step 150 "$OUT/offline_mini.txt" python benchmarks/offline_bench.py --preset mini --device cuda --prompts 16 \
  --prompt-tokens 128 --max-tokens 32 --rounds 3
