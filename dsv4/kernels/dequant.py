"""FP4 expert stacks, and FP8 linears, to dense rows in one pass (reference: QWeight.dequant).

Prefill's grouped experts read one layer's local experts dense (dsv4.model.moe_prefill). The
reference dequantisation makes an int64 index per stored byte, looks the byte up, then scales: about
14 bytes of traffic per weight, ~0.8 s per Flash chunk over 43 layers. Here each program reads a
tile of packed bytes and their ue8m0 scales and writes the values, low nibble first, straight into
the destination rows (2.5 bytes per weight in bf16). e2m1 times a power of two is exact in bf16 and
fp32, so the output equals the reference bit for bit (for a scale byte of 0, 2**-127, it writes 0).

A long prefill chunk's FP8 linears run as one GEMM on the weight dequantised for the chunk
(dsv4.model.linear). QWeight.dequant makes it in two torch passes, the e4m3 bytes to x's dtype then a
broadcast multiply by the block scales (7 bytes of traffic per weight in bf16, the multiply not
vectorised): on mini a 512-token prefill spent 5.1 of its 31.7 ms there (session 21, call 2). The FP8
kernel reads each byte and its block's scale once and writes the value (3 bytes per weight), with the
reference's roundings: the same bits (e4m3 decoded exactly in fp32 by integer operations, NaN
included; scales as QWeight.dequant takes them, 2**-127 and NaN ue8m0 bytes included).
"""

import os

import torch

from ..formats import FP8_BLOCK, QWeight
from . import cdiv, device_function, interpreting, launcher, pdl_wait

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # session 6: prefill_moe_bench's dense path through it equals the FP4 kernel's output (max
# relative error 0 at Flash's shapes, 4,096 and 8,192 tokens); its CUDA test in benchmarks/gpu_s6_call6.sh
# Rows x packed bytes per program, warps (benchmarks/prefill_moe_bench.py --dequant sweeps them). fp8: the FP8
# kernel for a long chunk's linears (session 21, calls 3-4: its CUDA test and a 512-token prefill;
# DSV4_DEQUANT_FP8=0: QWeight.dequant's torch passes), its rows x columns per program.
CONFIG = {"block_r": 16, "block_b": 64, "num_warps": 4, "fp8": os.environ.get("DSV4_DEQUANT_FP8", "1") == "1",
          "fp8_block_r": 8, "fp8_block_c": 512}


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


@device_function
def _e8m0_fp32(sc):
    """ue8m0 bytes (int32 0..255) as fp32, as torch reads them: 2**(b - 127); 0 is 2**-127 (an fp32 subnormal),
    255 NaN."""
    bits = tl.where(sc == 0, 0x00400000, tl.where(sc == 255, 0x7FC00000, sc << 23))
    return bits.to(tl.float32, bitcast=True)


def _fp8_dequant_kernel(w_ptr, s_ptr, out_ptr, ROWS, COLS, R0, C0, S_STRIDE, E8M0: constexpr,
                        ROUND_SCALE: constexpr, BLOCK_R: constexpr, BLOCK_C: constexpr):
    """out[r, c] = e4m3 byte w[r, c] times the scale of its 128 x 128 block (the slice starts R0 rows, C0 columns
    into its first block). ROUND_SCALE: the scale rounded to out's dtype first (QWeight._dequant_blocks), else
    the fp32 product rounded once (_dequant_any)."""
    pdl_wait()
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = (r < ROWS)[:, None] & (c < COLS)[None, :]
    r = r.to(tl.int64)
    b = tl.load(w_ptr + r[:, None] * COLS + c[None, :], mask=ok, other=0).to(tl.int32) & 0xFF
    e, m = (b >> 3) & 15, b & 7
    # e4m3fn: exponent bias 7, no infinities; exponent 0 the subnormals m * 2**-9; all ones (e 15, m 7) NaN.
    mag = tl.where(e == 0, m.to(tl.float32) * 0.001953125, (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True))
    mag = tl.where((e == 15) & (m == 7), float("nan"), mag)
    # The sign as a bit (Triton's -x is 0 - x, which makes -0.0 a +0.0).
    v = (mag.to(tl.int32, bitcast=True) | ((b & 128) << 24)).to(tl.float32, bitcast=True)
    sc = tl.load(s_ptr + ((r + R0) // 128)[:, None] * S_STRIDE + ((c + C0) // 128)[None, :], mask=ok, other=1)
    sc = _e8m0_fp32(sc.to(tl.int32) & 0xFF) if E8M0 else sc.to(tl.float32)
    dt = out_ptr.dtype.element_ty
    if ROUND_SCALE:
        sc = sc.to(dt).to(tl.float32)
    tl.store(out_ptr + r[:, None] * COLS + c[None, :], (v * sc).to(dt), mask=ok)


def fp8_supported(w: QWeight, dtype: torch.dtype) -> bool:
    """A 2-D FP8 weight with its block scales (ue8m0 or fp32), contiguous, to a float dtype (CONFIG fp8 on)."""
    return (CONFIG["fp8"] and w.fmt == "fp8" and w.scale is not None and w.data.dim() == 2
            and w.scale.dim() == 2 and w.data.is_contiguous() and w.scale.is_contiguous()
            and w.scale.dtype in (torch.float8_e8m0fnu, torch.float32)
            and dtype in (torch.float32, torch.bfloat16, torch.float16))


def fp8_dequant(w: QWeight, dtype: torch.dtype) -> torch.Tensor:
    """w.dequant(dtype), bit for bit, in one launch."""
    rows, cols = w.shape
    data = w.data.view(torch.uint8)
    scale = w.scale.view(torch.uint8) if w.scale.dtype == torch.float8_e8m0fnu else w.scale
    out = torch.empty(rows, cols, dtype=dtype, device=data.device)
    whole = not (w.row0 % FP8_BLOCK or w.col0 % FP8_BLOCK or rows % FP8_BLOCK or cols % FP8_BLOCK)
    # A ue8m0 scale is a power of two that bf16 and fp32 hold exactly: rounding it first changes nothing there.
    exact = scale.dtype == torch.uint8 and dtype != torch.float16
    c = CONFIG
    options = {} if interpreting() else {"num_warps": c["num_warps"]}
    launcher(_fp8_dequant_kernel, data)[(cdiv(rows, c["fp8_block_r"]), cdiv(cols, c["fp8_block_c"]))](
        data, scale, out, rows, cols, w.row0 % FP8_BLOCK, w.col0 % FP8_BLOCK, scale.stride(0),
        E8M0=scale.dtype == torch.uint8, ROUND_SCALE=whole and not exact, BLOCK_R=c["fp8_block_r"],
        BLOCK_C=c["fp8_block_c"], **options)
    return out
