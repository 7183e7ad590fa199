"""Decode GEMV straight from FP8/FP4 weights (reference: F.linear(x, QWeight.dequant(x.dtype))).

The reference dequantises a whole weight to x's dtype for each use: it writes and
rereads the weight at two or four times its stored size, and for the routed
experts first gathers the selected experts' bytes. Here one program computes
BLOCK_N outputs of one row from the stored bytes: FP8 e4m3 with one scale per
128x128 block, FP4 e2m1 (two per byte, low nibble first) with one scale per 32
inputs; ue8m0 scales are powers of two built from their exponent byte. Sums are
fp32, the output is rounded to x's dtype.

Three shapes of the same product:
- a linear: y[t] = W x[t];
- a grouped linear (wo_a): output rows in groups of GROUP_N, group g reading its own
  K-wide slice of x;
- routed experts: row r uses expert `expert[r]` of a stacked weight and x row
  r // ROWS_PER_X (the k selected experts of one token share its input).
"""

import torch

from ..formats import FP4_BLOCK, FP8_BLOCK, QWeight
from . import cdiv, interpreting, launcher

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

MAX_ROWS = 8  # above this many rows per weight (prefill), dequantise once and use one GEMM
# The launch configuration. DEFER sums each tile into a [BLOCK_N, BLOCK_K] accumulator and reduces
# across lanes once at the end (fewer shuffles per byte) and allows FP8 tiles wider than a scale
# block; benchmarks/qgemv_bench.py times the variants against the device's bandwidth. The default
# stays the configuration the GPU checks passed with until a variant has passed them too.
CONFIG = {"defer": False, "block_n": 32, "block_k_fp8": 128, "block_k_fp4": 64, "num_warps": None}


def _qgemv_kernel(x_ptr, w_ptr, s_ptr, e_ptr, y_ptr, N, x_stride, w_expert_stride, s_expert_stride, row_skew,
                  K: constexpr, S_STRIDE: constexpr, FP4: constexpr, E8M0: constexpr, ROWS_PER_X: constexpr,
                  EXPERTS: constexpr, GROUP_N: constexpr, BLOCK_N: constexpr, BLOCK_K: constexpr,
                  DEFER: constexpr):
    nb = tl.program_id(0)
    r = tl.program_id(1).to(tl.int64)
    n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    x_row = x_ptr + (r // ROWS_PER_X) * x_stride
    if GROUP_N > 0:
        x_row += ((nb * BLOCK_N) // GROUP_N) * K
    w, s = w_ptr, s_ptr
    if EXPERTS:
        e = tl.load(e_ptr + r).to(tl.int64)
        w += e * w_expert_stride
        s += e * s_expert_stride
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    tile = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)  # DEFER's accumulator
    if FP4:
        # One K tile = BLOCK_K packed bytes = 2 * BLOCK_K inputs; scale group of each byte column.
        j = tl.arange(0, BLOCK_K)
        for b0 in range(0, K // 2, BLOCK_K):
            b = b0 + j
            ok = n_ok[:, None] & (b < K // 2)[None, :]
            byte = tl.load(w + n[:, None].to(tl.int64) * (K // 2) + b[None, :], mask=ok, other=0).to(tl.int32) & 0xFF
            x_even = tl.load(x_row + 2 * b, mask=b < K // 2, other=0.0).to(tl.float32)
            x_odd = tl.load(x_row + 2 * b + 1, mask=b < K // 2, other=0.0).to(tl.float32)
            sc = tl.load(s + n[:, None].to(tl.int64) * S_STRIDE + (2 * b[None, :]) // 32, mask=ok, other=0)
            if E8M0:
                sc = (sc.to(tl.int32) << 23).to(tl.float32, bitcast=True)
            # e2m1 -> fp32 bits, for the low and the high nibble: sign bit 3, exponent bits 2-1 (bias 1),
            # mantissa bit 0; exponent 0 is the subnormal 0 or 0.5 (fp32 0x3F000000).
            lo, hi = byte & 15, byte >> 4
            ex, mt = (lo >> 1) & 3, lo & 1
            lo = (tl.where(ex == 0, mt * 0x3F000000, ((ex + 126) << 23) | (mt << 22)) | ((lo & 8) << 28))
            ex, mt = (hi >> 1) & 3, hi & 1
            hi = (tl.where(ex == 0, mt * 0x3F000000, ((ex + 126) << 23) | (mt << 22)) | ((hi & 8) << 28))
            part = (lo.to(tl.float32, bitcast=True) * x_even[None, :]
                    + hi.to(tl.float32, bitcast=True) * x_odd[None, :])
            if DEFER:
                tile += part * sc
            else:
                acc += tl.sum(part * sc, axis=1)
    else:
        k = tl.arange(0, BLOCK_K)  # without DEFER, BLOCK_K == 128: one scale per row of the tile
        s_row = s + ((n + row_skew) // 128).to(tl.int64) * S_STRIDE
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + k
            ok = n_ok[:, None] & (kk < K)[None, :]
            wv = tl.load(w + n[:, None].to(tl.int64) * K + kk[None, :], mask=ok, other=0.0).to(tl.float32)
            xv = tl.load(x_row + kk, mask=kk < K, other=0.0).to(tl.float32)
            if DEFER:
                sc = tl.load(s_row[:, None] + kk[None, :] // 128, mask=ok, other=0)
                if E8M0:
                    sc = (sc.to(tl.int32) << 23).to(tl.float32, bitcast=True)
                tile += wv * xv[None, :] * sc
            else:
                sc = tl.load(s_row + k0 // 128, mask=n_ok, other=0)
                if E8M0:
                    sc = (sc.to(tl.int32) << 23).to(tl.float32, bitcast=True)
                acc += tl.sum(wv * xv[None, :], axis=1) * sc
    if DEFER:
        acc = tl.sum(tile, axis=1)
    tl.store(y_ptr + r * N + n, acc.to(y_ptr.dtype.element_ty), mask=n_ok)


def supported(x: torch.Tensor, w: QWeight, rows: int) -> bool:
    if w.fmt not in ("fp8", "fp4") or rows > MAX_ROWS or w.scale is None or x.numel() == 0:
        return False
    if w.scale.dtype not in (torch.float8_e8m0fnu, torch.float32) or not (w.data.is_contiguous()
                                                                           and w.scale.is_contiguous()):
        return False
    if w.fmt == "fp8":
        return w.col0 % FP8_BLOCK == 0  # a K tile of 128 then has one scale per row
    return w.col0 == 0 and w.row0 == 0 and w.shape[1] % 2 == 0


def _launch(x, w: QWeight, y, rows: int, experts=None, rows_per_x: int = 1, group_n: int = 0):
    N, K = w.shape[-2], (x.shape[-1] if not group_n else w.shape[-1])
    scale = w.scale.view(torch.uint8) if w.scale.dtype == torch.float8_e8m0fnu else w.scale
    data = w.data.view(torch.uint8) if w.fmt == "fp4" else w.data
    lead = data.dim() - 2
    c = CONFIG
    block_n = c["block_n"]
    extra = {} if c["num_warps"] is None or interpreting() else {"num_warps": c["num_warps"]}
    launcher(_qgemv_kernel, x)[(cdiv(N, block_n), rows)](
        x, data, scale, experts if experts is not None else scale, y, N, x.stride(0),
        data.stride(0) if lead else 0, scale.stride(0) if lead else 0,
        w.row0 % FP8_BLOCK if w.fmt == "fp8" else 0,
        K=K, S_STRIDE=scale.shape[-1], FP4=w.fmt == "fp4", E8M0=scale.dtype == torch.uint8,
        ROWS_PER_X=rows_per_x, EXPERTS=experts is not None, GROUP_N=group_n, BLOCK_N=block_n,
        BLOCK_K=c["block_k_fp4"] if w.fmt == "fp4" else (c["block_k_fp8"] if c["defer"] else 128),
        DEFER=c["defer"], **extra)
    return y


def linear(x: torch.Tensor, w: QWeight) -> torch.Tensor:
    """x [..., K] -> [..., N]."""
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    y = torch.empty(x2.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
    return _launch(x2, w, y, x2.shape[0]).view(*x.shape[:-1], w.shape[0])


def grouped_linear(x: torch.Tensor, w: QWeight, groups: int) -> torch.Tensor:
    """x [T, groups * Kg], w [groups * O, Kg] (block diagonal) -> [T, groups * O]."""
    x = x.contiguous()
    y = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
    return _launch(x, w, y, x.shape[0], group_n=w.shape[0] // groups)


def expert_linear(x: torch.Tensor, stack: QWeight, experts: torch.Tensor, rows_per_x: int) -> torch.Tensor:
    """Row r of the output: expert experts[r] of `stack` [E, N, K] applied to x[r // rows_per_x]."""
    x = x.contiguous()
    rows = experts.numel()
    y = torch.empty(rows, stack.shape[0], dtype=x.dtype, device=x.device)
    return _launch(x, stack, y, rows, experts=experts.contiguous(), rows_per_x=rows_per_x)
