#!/usr/bin/env bash
# Session 33, call 1 (one H200, ~10 min), main + two switches, off by default:
#   hc_boundary's deferred Sinkhorn (CONFIG defer_sinkhorn, DSV4_BOUNDARY_DEFER=1): a boundary stores comb's logits and
#   the next one runs Sinkhorn on them before its PDL wait, off the finishing program's critical path;
#   layout's pair_norms (DSV4_PAIR_NORMS=1): q's latent norm and kv's norm + rope in one launch (normrope.q_kv_norms);
#   layout's fold_q_norm (DSV4_FOLD_Q_NORM=1): q's per-head norm and rope in the decode attention's split kernel.
#   1. tests/test_hc_boundary.py, tests/test_normrope.py, tests/test_attention_kernel.py (the new cases: defer's halves
#      against the plain boundary; the paired norms against the two launches bit for bit; the split kernel's q norm
#      against normrope's; each switch through tiny's decode on against off) and tests/test_replay_gpu.py; then
#      test_replay_gpu.py again with the three switches on (graph == eager);
#   2. the gate on mini with the three on (replay, refusals, batch identity);
#   3. decode_ab_bench: each switch and all three against the defaults, graph and pipelined, one process (ABBA);
#   4. ncu on the two expert kernels of a one-token step (mini's shapes): where their 0.59 / 0.43 of the copy
#      bandwidth goes (issue, stalls, occupancy), for the next lever.
# Usage: OUT=dir bash benchmarks/gpu_s33_call1.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=25
export FAILURES_FILE="$OUT/failures.txt" PYTHONPATH="$PYTHONPATH:$PWD/tests"
step 170 "$OUT/pytest_changed.txt" python -m pytest -q -p no:cacheprovider -n 3 --dist loadfile --tb=short -rfE \
  -p pytest_failures tests/test_hc_boundary.py tests/test_normrope.py tests/test_attention_kernel.py \
  tests/test_replay_gpu.py
ALL="DSV4_BOUNDARY_DEFER=1 DSV4_PAIR_NORMS=1 DSV4_FOLD_Q_NORM=1"
step 120 "$OUT/pytest_replay_all_on.txt" env $ALL python -m pytest -q -p no:cacheprovider --tb=short -rfE \
  tests/test_replay_gpu.py
step 100 "$OUT/gate_mini_all.txt" env $ALL python -m dsv4.cli gate --preset mini --device cuda --ranks 1 --batch 4 \
  --prime 64 --output 64 --out "$OUT/receipts-gate-mini-all.txt"
step 280 "$OUT/decode_ab.txt" python benchmarks/decode_ab_bench.py --preset mini --steps 64 --rounds 4 \
  --arm defer=hc_boundary.defer_sinkhorn=1 --arm pair=layout.pair_norms=1 --arm fold=layout.fold_q_norm=1 \
  --arm all=hc_boundary.defer_sinkhorn=1,layout.pair_norms=1,layout.fold_q_norm=1
step 60 "$OUT/ncu_moe1.txt" ncu --clock-control none --kernel-name regex:_gl_kernel --launch-skip 2 --launch-count 2 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
  --section MemoryWorkloadAnalysis --section LaunchStats python benchmarks/moe_one.py --tokens 1
