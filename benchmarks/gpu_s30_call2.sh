#!/usr/bin/env bash
# Session 30, call 2 (one H200, <= 8 min): the prefill graphs (DSV4_PREFILL_GRAPHS, dsv4.replay.PrefillReplay, off by
# default) on their first GPU run, and the rest of call 1's cut test files:
#   1. tests/test_prefill_graphs.py: replayed chunks == eager (logits, state digests, decode after), a slot's next
#      request replaying, a refusal inside a replayed chunk committing nothing; tiny and mini;
#   2. prefill_graph_probe.py: exact captures at 63 and 128 tokens, and the engine's path with and without the graphs
#      (one 16- and one 63-token chunk: a short prompt's time to first token; 16 chunks of 64: a long prompt in the
#      server's chunks);
#   3. tests/test_qgemv_mma.py and tests/test_moe_gl.py whole (the review mend's kernels; call 1 cut them at 150 s).
# Usage: OUT=dir bash benchmarks/gpu_s30_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 110 "$OUT/pytest_prefill_graphs.txt" python -m pytest -q -p no:cacheprovider -rfE tests/test_prefill_graphs.py
step 150 "$OUT/prefill_graph_probe.txt" python benchmarks/prefill_graph_probe.py --preset mini --tokens 63,128 \
  --engine 16:1,63:1,64:16 --runs 7
step 200 "$OUT/pytest_jit.txt" python -m pytest -q -p no:cacheprovider -n 3 --dist loadfile -rfE \
  tests/test_qgemv_mma.py tests/test_moe_gl.py
