#!/usr/bin/env bash
# One device call on 2 x H200 (nvidia-h200-x2): the GPU checks and benchmarks of a change, results under $OUT.
#   GPU 0: CUDA kernel tests + replay identity, then mini against HF (fp32);
#   GPU 1: mini decode with the torch reference, the GPU-checked kernels (auto) and every kernel
#          (triton), then the kernel profile and the GEMV's launch configurations;
#   both:  MINI_GATE=1: the gate on mini at the seed's sizes (256/256, 2 ranks);
#          then the gate on FLASH_PRIME/FLASH_OUTPUT (flash, 2 ranks; 0 skips it).
# Usage: OUT=dir [MINI_GATE=1] [FLASH_PRIME=64 FLASH_OUTPUT=64 GATE_TIMEOUT=330] bash benchmarks/gpu_checks.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONPATH=$PWD
OUT=${OUT:?}
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" > "$OUT/versions.txt"
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 240 python -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_replay_gpu.py > "$OUT/pytest_gpu.txt" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_gpu.txt"
  timeout 100 python benchmarks/mini_vs_hf.py 300 > "$OUT/mini_vs_hf.txt" 2>&1
) &
(
  export CUDA_VISIBLE_DEVICES=1
  BENCH="python -m dsv4.cli bench --preset mini --device cuda --prime 256 --steps 64"
  DSV4_KERNELS=torch timeout 120 $BENCH --rows 2 > "$OUT/decode_torch.txt" 2>&1
  timeout 120 $BENCH --rows 4 > "$OUT/decode_auto.txt" 2>&1
  # every kernel, those not yet checked on a GPU included (a kernel module's GPU_CHECKED = False)
  DSV4_KERNELS=triton timeout 120 $BENCH --rows 4 > "$OUT/decode_triton.txt" 2>&1
  timeout 60 python benchmarks/kernel_profile.py --preset mini > "$OUT/profile_mini.txt" 2>&1
  timeout 150 python benchmarks/qgemv_bench.py > "$OUT/qgemv.txt" 2>&1
) &
wait
KERNELS=auto
grep -q "pytest rc=0" "$OUT/pytest_gpu.txt" || KERNELS=torch  # a failing kernel must not sink the flash run
if [ "${MINI_GATE:-0}" = 1 ]; then
  /usr/bin/time -f "wall %e s" -o "$OUT/gate_mini_time.txt" env DSV4_KERNELS=$KERNELS timeout 400 \
    python -m dsv4.cli gate --preset mini --device cuda --ranks 2 --out "$OUT/gate_mini.txt" > "$OUT/gate_mini_stdout.txt" 2>&1
  echo "gate rc=$? kernels=$KERNELS" >> "$OUT/gate_mini_time.txt"
fi
if [ "${FLASH_PRIME:-0}" -gt 0 ]; then
  /usr/bin/time -f "wall %e s" -o "$OUT/gate_flash_time.txt" env DSV4_KERNELS=$KERNELS timeout "${GATE_TIMEOUT:-330}" \
    python -m dsv4.cli gate --preset flash --device cuda --ranks 2 --prime "$FLASH_PRIME" --output "$FLASH_OUTPUT" \
    --out "$OUT/gate_flash.txt" > "$OUT/gate_flash_stdout.txt" 2>&1
  echo "gate rc=$? kernels=$KERNELS" >> "$OUT/gate_flash_time.txt"
fi
