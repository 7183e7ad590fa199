"""FP4 expert stacks to dense rows in one pass (reference: QWeight.dequant, one expert slice at a time).

Prefill's grouped experts read one layer's local experts dense (dsv4.model.moe_prefill). The
reference dequantisation makes an int64 index per stored byte, looks the byte up, then scales: about
14 bytes of traffic per weight, ~0.8 s per Flash chunk over 43 layers. Here each program reads a
tile of packed bytes and their ue8m0 scales and writes the values, low nibble first, straight into
the destination rows (2.5 bytes per weight in bf16). e2m1 times a power of two is exact in bf16 and
fp32, so the output equals the reference bit for bit (for a scale byte of 0, 2**-127, it writes 0).
"""

import torch

from ..formats import QWeight
from . import cdiv, interpreting, launcher, pdl_wait

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # session 6: prefill_moe_bench's dense path through it equals the FP4 kernel's output (max
# relative error 0 at Flash's shapes, 4,096 and 8,192 tokens); its CUDA test in benchmarks/gpu_s6_call6.sh
# Rows x packed bytes per program, warps (benchmarks/prefill_moe_bench.py --dequant sweeps them).
CONFIG = {"block_r": 16, "block_b": 64, "num_warps": 4}


def _fp4_dequant_kernel(w_ptr, s_ptr, out_ptr, ROWS, R, out_e_stride, out_r_stride,
                        KB: constexpr, S_STRIDE: constexpr, E8M0: constexpr, BLOCK_R: constexpr,
                        BLOCK_B: constexpr):
    pdl_wait()
    row = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    b = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    ok = (row < ROWS)[:, None] & (b < KB)[None, :]
    row = row.to(tl.int64)
    byte = tl.load(w_ptr + row[:, None] * KB + b[None, :], mask=ok, other=0).to(tl.int32) & 0xFF
    sc = tl.load(s_ptr + row[:, None] * S_STRIDE + (2 * b[None, :]) // 32, mask=ok, other=0)
    if E8M0:
        sc = (sc.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    # e2m1 -> fp32 bits (as dsv4.kernels.qgemv): sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0;
    # exponent 0 is the subnormal 0 or 0.5 (fp32 0x3F000000).
    lo, hi = byte & 15, byte >> 4
    ex, mt = (lo >> 1) & 3, lo & 1
    lo = (tl.where(ex == 0, mt * 0x3F000000, ((ex + 126) << 23) | (mt << 22)) | ((lo & 8) << 28))
    ex, mt = (hi >> 1) & 3, hi & 1
    hi = (tl.where(ex == 0, mt * 0x3F000000, ((ex + 126) << 23) | (mt << 22)) | ((hi & 8) << 28))
    vals = tl.interleave(lo.to(tl.float32, bitcast=True) * sc, hi.to(tl.float32, bitcast=True) * sc)
    dst = out_ptr + (row // R) * out_e_stride + (row % R) * out_r_stride
    col = tl.program_id(1) * 2 * BLOCK_B + tl.arange(0, 2 * BLOCK_B)
    tl.store(dst[:, None] + col[None, :], vals.to(out_ptr.dtype.element_ty),
             mask=(row < ROWS)[:, None] & (col < 2 * KB)[None, :])


def supported(w: QWeight, out: torch.Tensor) -> bool:
    """An FP4 stack [n, R, K] stored whole (no slice offsets), written into out [n, R, K] with unit column stride."""
    return (w.fmt == "fp4" and w.scale is not None and w.data.dim() == 3 and w.row0 == 0 and w.col0 == 0
            and w.scale.dtype in (torch.float8_e8m0fnu, torch.float32) and w.data.is_contiguous()
            and w.scale.is_contiguous() and out.shape == (w.data.shape[0], *w.shape) and out.stride(-1) == 1
            and out.dtype in (torch.float32, torch.bfloat16, torch.float16))


def dequant_into(w: QWeight, out: torch.Tensor) -> torch.Tensor:
    """out[e, r, :] = expert e's row r of the FP4 stack w, dequantised (out may be a view of a wider stack)."""
    n, R, KB = w.data.shape
    data = w.data.view(torch.uint8)
    scale = w.scale.view(torch.uint8) if w.scale.dtype == torch.float8_e8m0fnu else w.scale
    c = CONFIG
    options = {} if interpreting() else {"num_warps": c["num_warps"]}
    launcher(_fp4_dequant_kernel, data)[(cdiv(n * R, c["block_r"]), cdiv(KB, c["block_b"]))](
        data, scale, out, n * R, R, out.stride(0), out.stride(1),
        KB=KB, S_STRIDE=scale.shape[-1], E8M0=scale.dtype == torch.uint8, BLOCK_R=c["block_r"],
        BLOCK_B=c["block_b"], **options)
    return out
