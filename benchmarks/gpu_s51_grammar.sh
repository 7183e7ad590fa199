#!/usr/bin/env bash
# For a device (written in session 51, no device lent): the grammar's device-side mask, the one part of the server's
# constrained output (response_format; tool_choice required / named / allowed_tools, strict tools,
# parallel_tool_calls false) that has not run on a GPU. sampling_check.py's even rows carry a mask every step (as
# the server's Constraint fills it): solo eager == batched eager == the batch graph, and every token inside its mask
# (SAMPLING_MASK allowed: true). If it exits 0: drop the CUDA refusal (protocol._check_grammar_on), and say so in
# README's sampler paragraph. Short: best run after another call on a warm machine.
# Usage: OUT=dir bash benchmarks/gpu_s51_grammar.sh
source benchmarks/gpu_env.sh
export DEADLINE_S=${DEADLINE_S:-200}
step 180 "$OUT/sampling_check_masks.txt" python benchmarks/sampling_check.py --preset mini --device cuda --rows 4 \
  --steps 24
