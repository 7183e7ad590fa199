#!/usr/bin/env bash
# For a device (written in session 51, no device lent): the two parts of the server's new requests that run on the
# device and have not run on a GPU, each refused on CUDA until this passes (DSV4_UNCHECKED_SAMPLING=1 serves them):
# 1. the grammar's device-side mask (response_format, structured_outputs, tool_choice required / named /
#    allowed_tools, strict tools, parallel_tool_calls false): sampling_check.py's even rows carry a mask every step, as
#    the server's Constraint fills it; solo eager == batched eager == the batch graph, every token inside its mask.
# 2. the scored prefill (completions' echo with logprobs: Model.prefill_scored): score_check.py, the state byte for
#    byte a plain prefill's, each chunk's last row's score the state's logits', rows against their prefixes' own
#    prefills within a tolerance, and its cost against the plain prefill.
# If a check exits 0: drop its CUDA refusal (protocol._unchecked_on_cuda: GRAMMAR, or the scored prefill) and say so in
# README. Short: best run after another call on a warm machine.
# Usage: OUT=dir bash benchmarks/gpu_s51_serve_checks.sh
source benchmarks/gpu_env.sh
export DEADLINE_S=${DEADLINE_S:-300}
step 150 "$OUT/sampling_check_masks.txt" python benchmarks/sampling_check.py --preset mini --device cuda --rows 4 \
  --steps 24
DSV4_UNCHECKED_SAMPLING=1 step 140 "$OUT/score_check_mini.txt" python benchmarks/score_check.py --preset mini --device cuda --tokens 600 \
  --chunk 256
