"""The v3 GEMV kernels as main had them before DSV4_PDL's early weight tile (commit 38341b6, session 11), with the
FP4 decode they called (prefill_moe's _fp4_tile), kept verbatim as the oracle of the peel: today's _qgemv3_kernel and
_dense3_kernel load their first K tile before the loop (and before pdl_wait) and must give these kernels' bits.
The tests launch them in their place (v3_main_launches); their first statement is pdl_wait (every kernel's since
session 18: under DSV4_PDL every launch is a launch_pdl), where main's released the next kernel."""

import contextlib

import pytest

from dsv4.kernels import dense, device_function, pdl_wait, qgemv
from dsv4.kernels.qgemv import _dot, _reduce_tile, _scale

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the tests that use them skip without triton
    tl, constexpr = None, int


@device_function
def _fp4_tile(w_ptr, s_ptr, cols, c_ok, k0, K: constexpr, S_STRIDE: constexpr, E8M0: constexpr,
              BLOCK_K: constexpr):
    """fp32 [BLOCK_N, BLOCK_K]: rows `cols` of one expert's FP4 weight [N, K] (bytes, low nibble first),
    inputs k0..k0 + BLOCK_K, times their ue8m0 scales (one per 32 inputs)."""
    b = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    ok = c_ok[:, None] & (b < K // 2)[None, :]
    rows = cols.to(tl.int64)
    byte = tl.load(w_ptr + rows[:, None] * (K // 2) + b[None, :], mask=ok, other=0).to(tl.int32) & 0xFF
    sc = tl.load(s_ptr + rows[:, None] * S_STRIDE + (2 * b[None, :]) // 32, mask=ok, other=0)
    if E8M0:
        sc = (sc.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    # A nibble's magnitude bits (exponent 2, mantissa 1) placed at fp16 bits 9-11 and its sign at bit 15 make
    # the fp16 of its e2m1 value times 2**-14, exactly (0.5 lands on an fp16 subnormal). (As dsv4.kernels.dequant,
    # a scale byte of 0, 2**-127, reads as 0.)
    lo = (((byte & 7) << 9) | ((byte & 8) << 12)).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    hi = (((byte & 0x70) << 5) | ((byte & 0x80) << 8)).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return tl.interleave(lo * 16384.0 * sc, hi * 16384.0 * sc)


def _qgemv3_kernel(x_ptr, w_ptr, s_ptr, y_ptr, p_ptr, tickets_ptr, N, rows, x_stride, row_skew, K: constexpr,
                   S_STRIDE: constexpr, FP4: constexpr, E8M0: constexpr, GROUP_N: constexpr, BLOCK_M: constexpr,
                   BLOCK_N: constexpr, BLOCK_K: constexpr, SPLITS: constexpr, K_CHUNK: constexpr,
                   FUSED_SUM: constexpr, IEEE: constexpr):
    """Grid (N blocks, SPLITS, row tiles of BLOCK_M): y[m, n] over inputs [split * K_CHUNK, +K_CHUNK) by tl.dot.
    SPLITS > 1: fp32 partials [rows, SPLITS, N] at p_ptr, summed into y_ptr by the last program of the (row tile,
    N block) (FUSED_SUM) or by _sum_splits_kernel after this launch."""
    pdl_wait()
    nb = tl.program_id(0)
    split = tl.program_id(1)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = m < rows
    n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    x_rows = x_ptr + m.to(tl.int64)[:, None] * x_stride
    if GROUP_N > 0:
        x_rows += ((nb * BLOCK_N) // GROUP_N) * K
    k_lo = split * K_CHUNK
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if FP4:
        for k0 in range(0, K_CHUNK, BLOCK_K):
            kk = k_lo + k0 + tl.arange(0, BLOCK_K)
            xv = tl.load(x_rows + kk[None, :], mask=m_ok[:, None] & (kk < K)[None, :], other=0.0)
            wv = _fp4_tile(w_ptr, s_ptr, n, n_ok, k_lo + k0, K, S_STRIDE, E8M0, BLOCK_K).to(xv.dtype)
            acc = _dot(xv, tl.trans(wv), acc, IEEE)
    else:
        k = tl.arange(0, 128)
        w_rows = w_ptr + n.to(tl.int64)[:, None] * K
        s_rows = s_ptr + ((n + row_skew) // 128).to(tl.int64) * S_STRIDE
        for k0 in range(0, K_CHUNK, BLOCK_K):
            for j in tl.static_range(BLOCK_K // 128):
                kb = k_lo + k0 + j * 128
                kk = kb + k
                ok = (kk < K)[None, :]
                xv = tl.load(x_rows + kk[None, :], mask=m_ok[:, None] & ok, other=0.0)
                wv = tl.load(w_rows + kk[None, :], mask=n_ok[:, None] & ok, other=0.0).to(tl.float32).to(xv.dtype)
                sc = _scale(tl.load(s_rows + kb // 128, mask=n_ok & (kb < K), other=0), E8M0)
                acc += _dot(xv, tl.trans(wv), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IEEE) * sc[None, :]
    if SPLITS == 1:
        tl.store(y_ptr + m.to(tl.int64)[:, None] * N + n[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=m_ok[:, None] & n_ok[None, :])
    elif FUSED_SUM:
        ticket = tickets_ptr + tl.program_id(2) * tl.num_programs(0) + nb
        _reduce_tile(acc, m, rows, p_ptr, y_ptr, ticket, split, n, N, SPLITS)
    else:
        tl.store(p_ptr + (m.to(tl.int64)[:, None] * SPLITS + split) * N + n[None, :], acc,
                 mask=m_ok[:, None] & n_ok[None, :])


def _dense3_kernel(x_ptr, w_ptr, y_ptr, p_ptr, tickets_ptr, N, rows, x_stride, K: constexpr, BLOCK_M: constexpr,
                   BLOCK_N: constexpr, BLOCK_K: constexpr, SPLITS: constexpr, K_CHUNK: constexpr,
                   FUSED_SUM: constexpr, IEEE: constexpr, EARLY: constexpr):
    """Grid (N blocks, SPLITS, row tiles of BLOCK_M): y[m, n] over inputs [split * K_CHUNK, +K_CHUNK) by tl.dot.
    SPLITS > 1: fp32 partials [rows, SPLITS, N] at p_ptr, summed into y_ptr as qgemv's _qgemv3_kernel does.
    EARLY: passed by the launch of today's kernel (dense._linear3); main's loop has no early load."""
    pdl_wait()
    nb = tl.program_id(0)
    split = tl.program_id(1)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = m < rows
    n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    x_rows = x_ptr + m.to(tl.int64)[:, None] * x_stride
    w_rows = w_ptr + n.to(tl.int64)[:, None] * K
    k = split * K_CHUNK + tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K_CHUNK, BLOCK_K):
        kk = k + k0
        ok = (kk < K)[None, :]
        xv = tl.load(x_rows + kk[None, :], mask=m_ok[:, None] & ok, other=0.0)
        wv = tl.load(w_rows + kk[None, :], mask=n_ok[:, None] & ok, other=0.0)
        acc = _dot(xv, tl.trans(wv), acc, IEEE)
    if SPLITS == 1:
        tl.store(y_ptr + m.to(tl.int64)[:, None] * N + n[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=m_ok[:, None] & n_ok[None, :])
    elif FUSED_SUM:
        ticket = tickets_ptr + tl.program_id(2) * tl.num_programs(0) + nb
        _reduce_tile(acc, m, rows, p_ptr, y_ptr, ticket, split, n, N, SPLITS)
    else:
        tl.store(p_ptr + (m.to(tl.int64)[:, None] * SPLITS + split) * N + n[None, :], acc,
                 mask=m_ok[:, None] & n_ok[None, :])


@contextlib.contextmanager
def v3_main_launches():
    """qgemv.linear and dense.linear with main's v3 kernels (launched as every kernel: they wait first) until the
    block ends."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(qgemv, "_qgemv3_kernel", _qgemv3_kernel)
        m.setattr(dense, "_dense3_kernel", _dense3_kernel)
        yield
