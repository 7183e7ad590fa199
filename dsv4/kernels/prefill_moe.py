"""Prefill's routed experts on the stored FP4 bytes: grouped matmuls that dequantise inside the tile loop.

Reference: dsv4.model.moe_prefill.grouped_experts's torch path, which dequantises every local expert of
the layer to a dense bf16 stack (4.3 + 2.1 GB per Flash layer on a rank of 2, written then read back)
and runs torch._grouped_mm, whatever the chunk's size: a 63-token chunk pays for 256 experts it mostly
does not use. Here the (token, expert) pairs, sorted by local expert as the reference sorts them, are
cut into tiles of BLOCK_M rows of one expert (`schedule`, on the device: no host read, a static grid
bounded by cdiv(pairs, BLOCK_M) + experts); each program multiplies its rows by a BLOCK_N slice of
that expert's weight, unpacking the FP4 bytes and their ue8m0 scales tile by tile into x's dtype
(exact: e2m1 times a power of two) before tl.dot. Experts no pair picked read no byte.

Kernel 1 runs gate (w1) and up (w3) for the same rows and columns and applies the SwiGLU activation
as dsv4.kernels.moe does (each projection rounded to x's dtype, silu rounded, product rounded); its
rows are gathered from x by the pair's token. Kernel 2 runs down (w2) on those activations. The
weighting and the sum over k stay in torch, in the reference's order. Sums are fp32 in tl.dot's order,
not torch._grouped_mm's: the output agrees with the reference to rounding (tests state the tolerance),
and is the same from run to run (no atomics).
"""

import torch

from ..formats import QWeight
from . import cdiv, device_function, interpreting, launcher, next_pow2, pdl_wait

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # session 5: its CUDA tests (against CUTLASS and the fp32 loop) and flash prefill at 4k-128k under DSV4_KERNELS=triton
# Columns and inputs per program, warps, pipeline stages, the most rows per tile (block_m follows the pairs
# per expert). benchmarks/prefill_moe_bench.py on an H200 (session 6), Flash's 128 local experts at 4,096
# tokens: 64/128/4/3 with 64 rows 23.1 ms, 128 rows 14.4 ms, 128 rows with K tiles of 64 and 4 stages 11.1 ms.
# dense_above: with more (token, expert) pairs per local expert than this (all ranks' pairs counted), the
# grouped path dequantises the stacks (dsv4.kernels.dequant) and runs torch._grouped_mm instead: each tile of
# rows here unpacks its expert's bytes again, and the unpacking, not the products, bounds this kernel. The
# same bench: the dense path 6.2 / 7.3 / 7.7 ms at 64 / 4,096 / 8,192 tokens, this kernel 7.0 / 11.1 / 20.5
# at best, so 0 (always, where the dequant kernel runs: moe_prefill._dense_chosen); None: always this kernel.
CONFIG = {"block_n": 64, "block_k": 64, "num_warps": 4, "num_stages": 4, "max_block_m": 128, "dense_above": 0}


@device_function
def _fp4_tile(w_ptr, s_ptr, cols, c_ok, k0, K: constexpr, S_STRIDE: constexpr, E8M0: constexpr,
              BLOCK_K: constexpr):
    """fp32 [BLOCK_N, BLOCK_K]: rows `cols` of one expert's FP4 weight [N, K] (bytes, low nibble first),
    inputs k0..k0 + BLOCK_K, times their ue8m0 scales (one per 32 inputs)."""
    byte, sc = _fp4_stored(w_ptr, s_ptr, cols, c_ok, k0, K, S_STRIDE, BLOCK_K)
    return _fp4_values(byte, sc, E8M0)


@device_function
def _fp4_stored(w_ptr, s_ptr, cols, c_ok, k0, K: constexpr, S_STRIDE: constexpr, BLOCK_K: constexpr):
    """_fp4_tile's operands as stored: the bytes [BLOCK_N, BLOCK_K // 2] and each byte's scale."""
    b = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    ok = c_ok[:, None] & (b < K // 2)[None, :]
    rows = cols.to(tl.int64)
    byte = tl.load(w_ptr + rows[:, None] * (K // 2) + b[None, :], mask=ok, other=0)
    return byte, tl.load(s_ptr + rows[:, None] * S_STRIDE + (2 * b[None, :]) // 32, mask=ok, other=0)


@device_function
def _fp4_values(byte, sc, E8M0: constexpr):
    """_fp4_tile from its stored operands (_fp4_stored)."""
    byte = byte.to(tl.int32) & 0xFF
    if E8M0:
        sc = (sc.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    # A nibble's magnitude bits (exponent 2, mantissa 1) placed at fp16 bits 9-11 and its sign at bit 15 make
    # the fp16 of its e2m1 value times 2**-14, exactly (0.5 lands on an fp16 subnormal). (As dsv4.kernels.dequant,
    # a scale byte of 0, 2**-127, reads as 0.)
    lo = (((byte & 7) << 9) | ((byte & 8) << 12)).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    hi = (((byte & 0x70) << 5) | ((byte & 0x80) << 8)).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return tl.interleave(lo * 16384.0 * sc, hi * 16384.0 * sc)


@device_function
def _fp4_dot(acc, a, w_ptr, s_ptr, cols, c_ok, k0, K: constexpr, S_STRIDE: constexpr, E8M0: constexpr,
             IEEE: constexpr, BLOCK_K: constexpr):
    """acc + a [BLOCK_M, BLOCK_K] @ (rows `cols` of an FP4 weight, inputs k0..k0 + BLOCK_K)^T on the tensor cores:
    the weight tile unpacked into a's dtype (exact). IEEE: fp32 operands and products (fp32 inputs; and the
    interpreter, whose tl.dot misreads bf16: the operands' values are the same, and a bf16 dot's products are
    exact in its fp32 accumulator anyway)."""
    t = _fp4_tile(w_ptr, s_ptr, cols, c_ok, k0, K, S_STRIDE, E8M0, BLOCK_K).to(a.dtype)
    if IEEE:
        return tl.dot(a.to(tl.float32), tl.trans(t.to(tl.float32)), acc, input_precision="ieee")
    return tl.dot(a, tl.trans(t), acc)


@device_function
def _swiglu(gate, up, dt: constexpr, limit):
    """dsv4.kernels.moe's activation of fp32 gate/up sums: each rounded to dt, the clamps, silu rounded, the
    product (fp32, holding it for the caller's rounding)."""
    gate = tl.minimum(gate.to(dt).to(tl.float32), limit)
    up = tl.minimum(tl.maximum(up.to(dt).to(tl.float32), -limit), limit)
    return (gate / (1.0 + tl.exp(-gate))).to(dt).to(tl.float32) * up


def _grouped_kernel(a_ptr, src_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, out_ptr, tile_expert_ptr, tile_row_ptr, ends_ptr,
                    N, n_local, w_expert_stride, s_expert_stride, limit, K: constexpr, S_STRIDE: constexpr,
                    E8M0: constexpr, GATHER: constexpr, SWIGLU: constexpr, IEEE: constexpr, BLOCK_M: constexpr,
                    BLOCK_N: constexpr, BLOCK_K: constexpr):
    """Grid (tiles, column blocks of N). Tile j: rows tile_row[j].. of expert tile_expert[j] (n_local: none).
    out[r, cols] = a[src[r] if GATHER else r] @ w1[e, cols]^T, or with SWIGLU the activation of it and w3's
    (IEEE: _fp4_dot's)."""
    pdl_wait()
    tile = tl.program_id(0)
    e = tl.load(tile_expert_ptr + tile)
    if e < n_local:
        g = e.to(tl.int64)
        rows = tl.load(tile_row_ptr + tile) + tl.arange(0, BLOCK_M)
        r_ok = rows < tl.load(ends_ptr + g)
        if GATHER:
            a_rows = tl.load(src_ptr + rows, mask=r_ok, other=0).to(tl.int64)
        else:
            a_rows = rows.to(tl.int64)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        c_ok = cols < N
        dt = out_ptr.dtype.element_ty
        w1, s1 = w1_ptr + g * w_expert_stride, s1_ptr + g * s_expert_stride
        w3, s3 = w3_ptr + g * w_expert_stride, s3_ptr + g * s_expert_stride
        acc1 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc3 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(a_ptr + a_rows[:, None] * K + kk[None, :], mask=r_ok[:, None] & (kk < K)[None, :], other=0.0)
            acc1 = _fp4_dot(acc1, a, w1, s1, cols, c_ok, k0, K, S_STRIDE, E8M0, IEEE, BLOCK_K)
            if SWIGLU:
                acc3 = _fp4_dot(acc3, a, w3, s3, cols, c_ok, k0, K, S_STRIDE, E8M0, IEEE, BLOCK_K)
        if SWIGLU:
            acc1 = _swiglu(acc1, acc3, dt, limit)
        tl.store(out_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :], acc1.to(dt),
                 mask=r_ok[:, None] & c_ok[None, :])


def supported(x: torch.Tensor, stacks: list[QWeight]) -> bool:
    """x [P, D] rows of a float dtype; stacks w1, w3 [n, I, D] and w2 [n, D, I], FP4 stored whole (no slice
    offsets), contiguous, ue8m0 (or fp32) scales, K a multiple of 32."""
    w1, w3, w2 = stacks
    return (x.dim() == 2 and x.is_contiguous() and x.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and all(w.fmt == "fp4" and w.scale is not None and w.data.dim() == 3 and w.row0 == 0 and w.col0 == 0
                    and w.data.is_contiguous() and w.scale.is_contiguous() and w.shape[1] % 32 == 0
                    and w.scale.dtype in (torch.float8_e8m0fnu, torch.float32) for w in stacks)
            and w1.shape == w3.shape and w1.scale.shape == w3.scale.shape and w1.shape[1] == x.shape[1]
            and w2.shape == (w1.shape[1], w1.shape[0]) and w1.scale.dtype == w2.scale.dtype)


def block_m(pairs: int, n: int) -> int:
    """Rows per tile: about the pairs an expert gets, 16 (tl.dot's least) to CONFIG's max_block_m (each tile
    unpacks its expert's weight slice again, so fuller tiles unpack less per product)."""
    return min(CONFIG["max_block_m"], max(16, 1 << max(0, (pairs // max(n, 1) - 1).bit_length())))


def schedule(ends: torch.Tensor, pairs: int, bm: int, bound: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert [tiles], first row [tiles]) of each tile of bm rows over the groups ending at ends [n] (int32,
    cumulative): tiles = cdiv(pairs, bm) + n, a static bound, or `bound` (at least the groups' own tiles);
    tiles past the groups' own get expert n."""
    n = ends.shape[0]
    ends = ends.long()
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    tiles = (counts + bm - 1) // bm
    cum = torch.cumsum(tiles, 0)
    j = torch.arange(cdiv(pairs, bm) + n if bound is None else bound, device=ends.device)
    expert = torch.searchsorted(cum, j, right=True)
    e = expert.clamp(max=n - 1)
    row = (ends - counts)[e] + (j - (cum - tiles)[e]) * bm
    return expert.to(torch.int32).contiguous(), row.to(torch.int32).contiguous()


def _launch(a, src, w1: QWeight, w3: QWeight, out, tiles, ends, limit: float, swiglu: bool, bm: int):
    d1, s1 = w1.data.view(torch.uint8), _scale(w1)
    d3, s3 = w3.data.view(torch.uint8), _scale(w3)
    expert, row = tiles
    N, K = w1.shape
    c = CONFIG
    options = {} if interpreting() else {"num_warps": c["num_warps"], "num_stages": c["num_stages"]}
    launcher(_grouped_kernel, a)[(expert.shape[0], cdiv(N, c["block_n"]))](
        a, src if src is not None else expert, d1, s1, d3, s3, out, expert, row, ends, N, w1.data.shape[0],
        d1.stride(0), s1.stride(0), float(limit), K=K, S_STRIDE=s1.shape[-1], E8M0=s1.dtype == torch.uint8,
        GATHER=src is not None, SWIGLU=swiglu, IEEE=a.dtype == torch.float32 or interpreting(), BLOCK_M=bm,
        BLOCK_N=c["block_n"],
        BLOCK_K=min(c["block_k"], next_pow2(K)), **options)
    return out


def _scale(w: QWeight) -> torch.Tensor:
    return w.scale.view(torch.uint8) if w.scale.dtype == torch.float8_e8m0fnu else w.scale


def experts(x: torch.Tensor, src: torch.Tensor, ends: torch.Tensor, stacks: list[QWeight],
            limit: float) -> torch.Tensor:
    """Rows [P, D] in pair order (sorted by local expert, group g ending at ends[g]): row r is
    w2_g(SwiGLU(w1_g x[src[r]], w3_g x[src[r]])) for its expert g; rows past ends[-1] are unset."""
    w1, w3, w2 = stacks
    P, n = src.shape[0], ends.shape[0]
    bm = block_m(P, n)
    tiles = schedule(ends, P, bm)
    h = torch.empty(P, w1.shape[0], dtype=x.dtype, device=x.device)
    _launch(x, src.contiguous(), w1, w3, h, tiles, ends, limit, True, bm)
    y = torch.empty(P, w2.shape[0], dtype=x.dtype, device=x.device)
    return _launch(h, None, w2, w2, y, tiles, ends, limit, False, bm)
