# Sourced by benchmarks/gpu_*.sh at the start of a device call: the NCCL/symmetric-memory settings of
# /work/.library/device's H200 notes, outputs written under a scratch folder ($RES, or a temporary one) and
# returned at exit as $OUT/results.tgz beside $OUT/summary.txt (the tail of each output; the device tool
# returns at most 8 files), the serving wheels carried in .whl installed (the GPU image lacks openai,
# fastapi, uvicorn, ...; benchmarks/fetch_wheels.sh downloads them), and the versions in versions.txt.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
FINAL=${OUT:?}
OUT=${RES:-$(mktemp -d)}; mkdir -p "$OUT"
pack() {
  for f in "$OUT"/*; do echo "== $(basename "$f")"; tail -n "${SUMMARY_LINES:-30}" "$f"; done > "$FINAL/summary.txt" 2>&1
  tar czf "$FINAL/results.tgz" -C "$OUT" .
}
trap pack EXIT
if [ -d .whl ]; then
  python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    > "$OUT/wheels.txt" 2>&1 && export PYTHONPATH=$PWD:/tmp/site
fi
{ python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; nvidia-smi -L; } \
  > "$OUT/versions.txt" 2>&1
# step LIMIT_S OUTPUT_FILE COMMAND...: the command in its own process group, killed whole past LIMIT_S seconds (rc 137),
# so spawned ranks still spinning on a GPU (a p2p protocol bug hangs rather than fails) do not outlive it.
# With DEADLINE_S set, a step's limit is cut to what is left of it (bash's $SECONDS count from the script's start), so
# a call of several steps returns its outputs inside the device's 600-second command limit; a step given under 5 s is
# skipped and says so.
step() {  # step LIMIT_S OUTPUT_FILE COMMAND...
  local limit=$1 file=$2; shift 2
  if [ -n "${DEADLINE_S:-}" ]; then
    local left=$((DEADLINE_S - SECONDS))
    if [ "$left" -lt 5 ]; then echo "skipped: DEADLINE_S=$DEADLINE_S reached" > "$file"; return; fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  setsid "$@" > "$file" 2>&1 &
  local pid=$!
  (sleep "$limit" && kill -KILL -- "-$pid") 2>/dev/null &
  local watchdog=$!
  wait "$pid"; local rc=$?
  kill "$watchdog" 2>/dev/null
  echo "rc=$rc" >> "$file"
}

# Every test file with CUDA cases (the CPU-only files are CI's), and gpu_suite LIMIT_S OUTPUT_FILE [PYTEST ARGS...]:
# them in 5 xdist workers, one file a worker (pytest-xdist carried in .whl; 5 keeps the files that build mini,
# ~22 GB each, within an H200's memory). The suite outgrew one call in session 35 (838 tests, cut at 575 s near its
# end twice), so it comes in two halves (session 36): GPU_SUITE_MODEL_FILES (the files that build a model or run
# a whole step) and GPU_SUITE_KERNEL_FILES; GPU_SUITE_FILES is both. test_kernels' sm_90 compile (a CPU test, CI's
# longest: minutes in one process) is deselected here. With $DURATIONS_FILE set (the plugin pytest_failures) every
# test's seconds are written as it ends.
GPU_SUITE_MODEL_FILES="tests/test_replay_gpu.py tests/test_generation_gpu.py tests/test_speculative_gpu.py tests/test_prefix_cache_gpu.py tests/test_pool.py tests/test_cli.py tests/test_profile.py tests/test_prefill_graphs.py tests/test_prefill_batch.py tests/test_prefill_limit.py tests/test_prefill.py tests/test_moe_options_gpu.py tests/test_moe_tc.py tests/test_qkvfuse.py tests/test_xproj.py tests/test_commit_step.py tests/test_moe_decode_options.py tests/test_kernels.py"
GPU_SUITE_KERNEL_FILES="tests/test_attention_kernel.py tests/test_bookkeeping.py tests/test_compressor_kernel.py tests/test_dense_kernel.py tests/test_door_kernel.py tests/test_draw_kernel.py tests/test_expert_groups.py tests/test_geometry_kernel.py tests/test_hc_boundary.py tests/test_hc_head.py tests/test_moe_decode.py tests/test_moe_gl.py tests/test_normrope.py tests/test_prefill_attention.py tests/test_qgemv.py tests/test_qgemv_mma.py tests/test_rope_table.py tests/test_route_kernel.py tests/test_sample_kernel.py tests/test_sampler.py tests/test_topk_kernel.py tests/test_undo.py tests/test_gumbel.py"
GPU_SUITE_FILES="$GPU_SUITE_MODEL_FILES $GPU_SUITE_KERNEL_FILES"
gpu_suite() {  # gpu_suite LIMIT_S OUTPUT_FILE [PYTEST ARGS...]: every file of $GPU_SUITE_FILES
  gpu_suite_of "$GPU_SUITE_FILES" "$@"
}
gpu_suite_of() {  # gpu_suite_of "FILES" LIMIT_S OUTPUT_FILE [PYTEST ARGS...]
  local files=$1 limit=$2 file=$3; shift 3
  # shellcheck disable=SC2086
  step "$limit" "$file" python -m pytest -q -p no:cacheprovider -n 5 --dist loadfile -rfE \
    --deselect tests/test_kernels.py::test_every_kernel_compiles_for_sm90 "$@" $files
}
