# Sourced by benchmarks/gpu_*.sh at the start of a device call: the NCCL/symmetric-memory settings of
# /work/.library/device's H200 notes, outputs written under a scratch folder ($RES, or a temporary one) and
# returned at exit as $OUT/results.tgz beside $OUT/summary.txt (the tail of each output; the device tool
# returns at most 8 files), the serving wheels carried in .whl installed (the GPU image lacks openai,
# fastapi, uvicorn, ...), and the versions in versions.txt.
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
step() {  # step LIMIT_S OUTPUT_FILE COMMAND...
  local limit=$1 file=$2; shift 2
  setsid "$@" > "$file" 2>&1 &
  local pid=$!
  (sleep "$limit" && kill -KILL -- "-$pid") 2>/dev/null &
  local watchdog=$!
  wait "$pid"; local rc=$?
  kill "$watchdog" 2>/dev/null
  echo "rc=$rc" >> "$file"
}
