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

Two kernels compute it; CONFIG["kernel"] picks one. "v1" (_qgemv_kernel) is the one the GPU
checks passed with. "v2" (_qgemv2_kernel) is built to stream at the memory's rate: 3-D tiles
whose inner axis is one scale block (FP8: 128 inputs; FP4: 4 words of 8 inputs), so a scale is
applied once per block and the weight loads are 16-byte vectors; FP4 decoded two values per
operation from 32-bit words (e2m1 placed in fp16 bits, exact subnormals included); and split-K
for the shapes with few output rows: SPLITS programs per row block write fp32 partials that are
summed in a fixed order (deterministic, no float atomics), either by a second launch
(_sum_splits_kernel) or, with CONFIG["v2_fused_sum"], by the last of a row block's programs to
finish (_reduce_splits: an int32 ticket per (row, row block) counts the finished splits). Both sum
the same partials in split order 0..SPLITS-1, so their outputs are bit-identical. Rows that share a
weight (a batched decode step's) are computed up to CONFIG["v2_rows"] in one program: each weight tile is
loaded (and decoded) once and applied to each row in turn by that row's own operations, the ones a
program of that row alone runs, so a row's bits do not depend on the others. The helpers _fp8_rows and
_fp4_rows are shared with the fused MoE kernels (dsv4.kernels.moe).

"v3" (_qgemv3_kernel) runs the weights every row shares (not the routed experts': those stay on v2) on the tensor
cores, whose arithmetic per row v2 spends on the CUDA cores: a program computes a [BLOCK_M = 16 rows, BLOCK_N]
output tile with tl.dot, the x rows padded to 16 with zeros (masked loads), the weight tile converted to x's dtype
(e4m3 and e2m1 values are exact in bf16). FP8: each 128-wide K block's dot (fp32) is multiplied by that block's
scale and added to the accumulator, blocks in ascending order; FP4: the scales (powers of two) are folded into the
tile before the dot (exact), as prefill's experts do. An MMA computes each output element from its own row and
column, in an order fixed by the instruction and the K loop, and the tile shapes, the K loop and the split
(splits_for, from the weight alone) never depend on the rows: a row's bits are the same alone (padded) or among 15
others, in any row tile. Splits are summed as v2's, in split order (_reduce_tile's ticket or _sum_splits_kernel).
fp32 x (and Triton's interpreter, whose tl.dot misreads bf16) take fp32 operands with input_precision="ieee".
"""

import os

import torch

from ..formats import FP4_BLOCK, FP8_BLOCK, QWeight
from . import PDL, cdiv, device_function, interpreting, lanes, launcher, next_pow2, pdl_release, pdl_wait, qgemv_mma
from .prefill_moe import _fp4_stored, _fp4_values

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # through benchmarks/gpu_checks.sh: "auto" runs it on CUDA (dsv4.kernels.enabled)

MAX_ROWS = 8  # above this many rows per weight (prefill), dequantise once and use one GEMM
# The launch configuration. v1's keys: DEFER sums each tile into a [BLOCK_N, BLOCK_K] accumulator and reduces
# across lanes once at the end (fewer shuffles per byte) and allows FP8 tiles wider than a scale
# block; benchmarks/qgemv_bench.py times the variants against the device's bandwidth. From its runs
# on an H200 (benchmarks/RESULTS.md, session 3): one Flash layer's attention linears v1 84 us, v2
# 40 us; v2 is the default (DSV4_QGEMV=v1 keeps the first kernel, with its best configuration).
#
# v2's keys: rows per program, inputs per K tile (FP8: a multiple of 128, FP4: of 32), warps, and
# split-K: "v2_split_k" programs along K per row block, or 0 to double it while the launch has
# fewer than "v2_programs" programs and each split keeps at least one K tile; "v2_fused_sum": the
# splits are summed by the last program of each row block instead of a second launch (same bits; on since
# session 6: flash decode 84.0 -> 90.0 tok/s, replay tests passed; DSV4_FUSED_SPLIT_SUM=0 keeps two launches);
# "v2_rows": at most this many rows that share a weight (not the routed experts') are computed by one program,
# which reads each weight tile once for all of them (1: a program per row); a row's bits are the same either way
# (DSV4_GEMV_ROWS sets it and dense's "rows").
# "v2_unroll": the FP8 tile loop unrolled at compile time, so later tiles' loads may be issued before earlier tiles'
# products (the same bits; session 17 call 1, mini's shapes: wo_a 13.99 -> 11.73 us, wo_b 13.94 -> 12.87;
# DSV4_QGEMV_UNROLL=0 for the loop).
# v3's FP8 tile loop is not unrolled: Triton pipelines it through shared memory (cp.async), and session 25 call 1
# measured the unrolled form (the same bits) at one Flash layer's FP8 linears 55.7 us against 56.3 at one row, 60.9
# against 60.7 at 16 (qgemv_bench, one process): removed again. Nor did two other load schedules, each the same bits
# (qgemv_bench, one Flash layer's FP8 linears at 1 / 16 rows, against 55.5-56.3 / 59.7-60.7 us): programs that walk
# several N blocks in one software-pipelined loop (call 3: 128 of them 58.7 / 58.9 us), and a program's K chunk
# loaded as one tile (call 4: 67.4 / 71.3). ncu on a Flash rank's wo_b at one row (call 3): 512 programs of two
# 512-input tiles all resident at once (0.65 waves, 80 registers), DRAM at 27 % of its peak, 44 % of the warps' time
# waiting on loads; sm_90 SASS: every 128-wide block's x and weights pass through shared memory (LDG, STS, a
# barrier, LDS / LDSM) before its products. Triton's code for this mixed-precision dot, not the load order, is what
# holds v3 at a third of the bandwidth; a hand-laid kernel (as moe_gl's) is the next step.
# Session 26 call 1 measured the operands swapped (y^T = W x^T, the weight tile the A operand of sm_90's warpgroup
# MMA, 64-output blocks, the rows its 16 columns; session 25's DSV4_QGEMV_V3_SWAP, other bits than v3): a Flash layer's
# FP8 linears at 1 / 16 rows 55.2 / 60.1 us against v3's 54.2 / 59.2 (132 programs 52.5 / 56.6); ncu at wo_b, one row:
# 15.1 us, DRAM 23 % of its peak (v3 13.0 us, 27 %). Not kept.
# v3's keys: outputs per program (BLOCK_N; the rows are always a tile of 16), inputs per K tile (FP8: a multiple of
# 128, each 128 one dot; FP4: one dot), warps; its split-K is v2's ("v2_split_k", "v2_programs") and so is its split
# sum ("v2_fused_sum"). DSV4_QGEMV=v3 (or `--gemv v3`, kernels.select_gemv) picks it. Session 7 on an H200, one
# flash layer's FP8 linears: 1 row v2 54.5 us, v3 77.7; 16 rows v2 303.7 us, v3 80.2: v3 is for batched serving.
# v3 with 2 or 4 row tiles a program (a weight tile loaded and widened once for them; session 31) was measured in
# session 32 (call 1: a 16 x 63-token prefill wave 57.3 ms at one tile, 58.0 at 2, 61.9 at 4, the same bits) and
# removed: its registers cost more than the reads it saved.
CONFIG = {"kernel": os.environ.get("DSV4_QGEMV", "v2"),
          "defer": True, "block_n": 16, "block_k_fp8": 256, "block_k_fp4": 128, "num_warps": 4,
          "v2_block_n": 16, "v2_block_k_fp8": 512, "v2_block_k_fp4": 1024, "v2_num_warps": 4, "v2_split_k": 0,
          "v2_programs": 264, "v2_fused_sum": os.environ.get("DSV4_FUSED_SPLIT_SUM", "1") == "1",
          "v2_rows": int(os.environ.get("DSV4_GEMV_ROWS", "8")),
          "v3_block_n": 32, "v3_block_k_fp8": 512, "v3_block_k_fp4": 128, "v3_num_warps": 4,
          "v2_shape_tiles": os.environ.get("DSV4_QGEMV_SHAPE_TILES", "1") == "1",
          "v2_unroll": os.environ.get("DSV4_QGEMV_UNROLL", "1") == "1",
          "v2_wide_max_n": int(os.environ.get("DSV4_QGEMV_WIDE_MAX_N", "4096")),
          "v2_wo_tiles": os.environ.get("DSV4_QGEMV_WO_TILES", "1") == "1",
          "v2_xq_tiles": os.environ.get("DSV4_QGEMV_XQ_TILES", "1") == "1",
          "v2_early_tiles": int(os.environ.get("DSV4_QGEMV_EARLY_TILES", "2"))}
# "v2_early_tiles" (DSV4_QGEMV_EARLY_TILES; 2 by default since session 41, 1 as before): the FP8 tiles of a stored
# weight a program loads before its wait (EARLY, unrolled loops: at most its K chunk's tiles). One tile in flight
# while the kernel before finishes is 8 KB a program at the output linears' 8-row blocks (wo_b: 8 tiles of 1,024
# inputs a program); with more, more of the program's bytes are on their way when the wait ends. The tiles are
# summed after the wait in the same order: the same bits. Session 41 call 4 (decode_ab on mini, one process, the same
# stream in every arm): 2 tiles pipelined 986.6 -> 990.3 tok/s (ahead in every round), graph 962.9 -> 972.9; 4 and 8
# lose (951.6, 927.0: wo_b's programs at 80 and 130 registers, fewer of them an SM).
# v2's FP8 tiles by the weight's shape ("v2_shape_tiles"; DSV4_QGEMV_SHAPE_TILES=0: CONFIG's tiles for every
# shape): (rule, BLOCK_N, BLOCK_K, warps, programs), the first rule that holds; programs is the split-K's target
# (splits_for; None: CONFIG's "v2_programs"). A decode GEMV of one row is bound by its DRAM round trips and by the
# instructions a weight takes, so a K that fits one tile (<= 2,048 inputs) is read in one pass, and wider row blocks
# (x's inputs converted once for 2 or 4 rows a thread) split along K for the 4,096- and 8,192-input weights.
# Session 15 call 1 (qgemv_bench, copy bandwidth measured in the call): mini's wq_b 16.77 -> 11.59 us, shared w2
# 6.72 -> 4.88. Session 17 call 1 (the tile loop unrolled, no carried tile): a Flash rank's wo_a 9.61 -> 8.02 us,
# wo_b 9.72 -> 8.24 (64-row blocks, one 512-input tile a program); mini's wo_b 12.87 -> 12.08 (32-row blocks of
# 1,024 inputs); the other shapes are fastest at CONFIG's tiles. The tiles depend on the weight alone: a row's bits
# are the same whatever the batch.
# "v2_wide_max_n" (DSV4_QGEMV_WIDE_MAX_N; 4,096 by default; WIDE_TILES, with "v2_wo_tiles" off): the most rows the 64-row blocks of 512 inputs take at
# K = 4,096 (a Flash rank's wo_a and wo_b); 8,192 takes mini's wo_a (its 8 groups of 1,024 rows on one GPU) too,
# split 8 ways along K (other bits than its 16-row blocks of the whole K: an arm of benchmarks/decode_ab_bench.py).
# "v2_wo_tiles" (DSV4_QGEMV_WO_TILES=0 turns it off): the attention's output linears (wo_a, wo_b: K of 4,096 with
# 2,048-8,192 rows, K of 8,192 with at most 4,096) in 8-row blocks of 1,024-input tiles, 8 warps, the whole K a
# program (at these shapes 512-1,024 row blocks, past the split's 264-program target: no split), instead of session
# 17's rules (WIDE_TILES). Session 40 call 1 (qgemv_bench, copy bandwidth measured in the run): mini's wo_a 13.79 ->
# 11.43 us, wo_b 11.79 -> 10.86; a Flash rank's wo_a 7.22 -> 6.14, wo_b 7.35 -> 5.93. Other bits than the rules before
# (no split: one order over K), the same whatever the batch.
SHAPE_TILES = ((lambda N, K: 512 < K <= 1024, 16, 1024, 4, None),
               (lambda N, K: 1024 < K <= 2048, 8, 2048, 8, None))
WO_TILES = ((lambda N, K: (K == 4096 and 2048 <= N <= 8192) or (K == 8192 and N <= 4096), 8, 1024, 8, None),)
# "v2_xq_tiles" (DSV4_QGEMV_XQ_TILES=0 turns it off): the stacked wq_a + wkv (K of 4,096, fewer than 2,048 rows) in
# 8-row blocks of 2,048-input tiles, 8 warps, split in two (session 40 call 2's qgemv_bench: wq_a alone 4.04 -> 3.49
# us, wkv 3.22 -> 3.00; decode_ab on mini, pipelined: call 5 969.3 -> 972.9 tok/s, ahead in every round, call 6
# 965.4 -> 968.7). Other bits than CONFIG's tiles.
XQ_TILES = ((lambda N, K: K == 4096 and N < 2048, 8, 2048, 8, None),)
WIDE_TILES = ((lambda N, K: K == 4096 and 2048 <= N <= CONFIG["v2_wide_max_n"], 64, 512, 4, 2048),
              (lambda N, K: K == 8192 and N <= 4096, 32, 1024, 4, None))


def v2_tiles(N: int, K: int, fp4: bool, experts: bool, group_n: int = 0) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, warps, programs) of a v2 launch on a weight [N, K]: SHAPE_TILES' for a stored FP8 weight
    (a grouped one's groups holding whole row blocks), else CONFIG's."""
    c = CONFIG
    if c["v2_shape_tiles"] and not fp4 and not experts:
        rules = SHAPE_TILES + (WO_TILES if c["v2_wo_tiles"] else WIDE_TILES) + (XQ_TILES if c["v2_xq_tiles"] else ())
        for holds, block_n, block_k, warps, programs in rules:
            if holds(N, K) and (not group_n or group_n % block_n == 0):
                return block_n, block_k, warps, programs or c["v2_programs"]
    return c["v2_block_n"], c["v2_block_k_fp4" if fp4 else "v2_block_k_fp8"], c["v2_num_warps"], c["v2_programs"]


def _qgemv_kernel(x_ptr, w_ptr, s_ptr, e_ptr, y_ptr, N, x_stride, w_expert_stride, s_expert_stride, row_skew,
                  K: constexpr, S_STRIDE: constexpr, FP4: constexpr, E8M0: constexpr, ROWS_PER_X: constexpr,
                  EXPERTS: constexpr, GROUP_N: constexpr, BLOCK_N: constexpr, BLOCK_K: constexpr,
                  DEFER: constexpr):
    pdl_wait()
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



@device_function
def _scale(sc, E8M0: constexpr):
    """Stored scales -> fp32: a ue8m0 byte is the exponent field of a power of two."""
    if E8M0:
        sc = (sc.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    return sc


@device_function
def _fp8_tile(w_rows, s_rows, n_ok, k, col, blocks, K: constexpr):
    """_fp8_rows' tile at input k as stored: (e4m3 weights, block scales)."""
    kk = k + col
    wq = tl.load(w_rows + kk[None, :, :], mask=n_ok[:, None, None] & (kk < K)[None, :, :], other=0.0)
    blk = k // 128 + blocks
    return wq, tl.load(s_rows + blk[None, :], mask=n_ok[:, None] & (blk * 128 < K)[None, :], other=0)


@device_function
def _fp8_rows(xs, w, s, n, N, row_skew, k_lo, SPAN: constexpr, K: constexpr, S_STRIDE: constexpr, E8M0: constexpr,
              BLOCK_N: constexpr, BLOCK_K: constexpr, EARLY: constexpr = False, UNROLL: constexpr = False,
              PRE: constexpr = 1):
    """A tuple of fp32 [BLOCK_N], one per x row of the tuple xs: rows n of an FP8 weight [N, K] (128x128 block
    scales) times that x over inputs [k_lo, min(k_lo + SPAN, K)). A tile is [BLOCK_N, BLOCK_K // 128, 128]: the
    inner axis shares one scale, applied after its sum. Each tile is read once for all x rows, and each row's
    sum is the one it gets alone: the same operations on the same tile layout, in the same order.

    EARLY (a weight no step writes): the first PRE tiles are loaded before the loop (SPAN > 0: a split always
    has inputs; PRE * BLOCK_K <= SPAN), with pdl_wait while their loads are in flight, before x is read, then summed
    in order. The loop never carries a tile
    from one iteration to the next: a carried FP8 tile cost ~3 byte permutes a weight on sm_90 (SASS counted: the
    loop of wo_b's tiles 768 -> 504 instructions a tile without the carry). UNROLL: the tile loop unrolled at
    compile time, so the compiler may issue later tiles' loads before earlier tiles' products (more bytes in flight
    a program). The sums are the same in every form: the same products, in the same order."""
    ROWS: constexpr = len(xs)
    KB: constexpr = BLOCK_K // 128
    blocks = tl.arange(0, KB)
    col = blocks[:, None] * 128 + tl.arange(0, 128)[None, :]
    n_ok = n < N
    w_rows = w + n.to(tl.int64)[:, None, None] * K
    s_rows = s + ((n + row_skew) // 128).to(tl.int64)[:, None] * S_STRIDE
    accs = (tl.zeros([BLOCK_N, KB], dtype=tl.float32),) * ROWS
    FIRST: constexpr = PRE * BLOCK_K if EARLY else 0
    if EARLY:
        ahead = ()  # the first PRE tiles in flight while the kernel before finishes
        for j in tl.static_range(PRE):
            ahead = ahead + (_fp8_tile(w_rows, s_rows, n_ok, k_lo + j * BLOCK_K, col, blocks, K),)
        pdl_wait()
        for j in tl.static_range(PRE):
            accs = _fp8_products(accs, xs, ahead[j][0], ahead[j][1], k_lo + j * BLOCK_K, col, K, E8M0)
    if UNROLL:
        for k0 in tl.static_range(FIRST, SPAN, BLOCK_K):
            wq, sq = _fp8_tile(w_rows, s_rows, n_ok, k_lo + k0, col, blocks, K)
            accs = _fp8_products(accs, xs, wq, sq, k_lo + k0, col, K, E8M0)
    else:
        for k0 in range(FIRST, SPAN, BLOCK_K):
            wq, sq = _fp8_tile(w_rows, s_rows, n_ok, k_lo + k0, col, blocks, K)
            accs = _fp8_products(accs, xs, wq, sq, k_lo + k0, col, K, E8M0)
    return [tl.sum(acc, axis=1) for acc in accs]


@device_function
def _fp8_products(accs, xs, wq, sq, k, col, K: constexpr, E8M0: constexpr):
    """accs (one per x row) plus the tile at input k times each row's x: each scale block's sum times its scale."""
    kk = k + col
    ok = kk < K
    wv = wq.to(tl.float32)
    sc = _scale(sq, E8M0)
    summed = ()
    for i in tl.static_range(len(xs)):
        xv = tl.load(xs[i] + kk, mask=ok, other=0.0).to(tl.float32)
        summed = summed + (accs[i] + tl.sum(wv * xv[None, :, :], axis=2) * sc,)
    return summed


@device_function
def _fp4_words(w_rows, n_ok, k, words, K: constexpr):
    """_fp4_rows' tile at input k as stored: int32 words [G, BLOCK_N, 4]."""
    wi = k // 8 + words
    return tl.load(w_rows + wi[:, None, :], mask=(wi < K // 8)[:, None, :] & n_ok[None, :, None], other=0)


@device_function
def _fp4_scales(s_rows, n_ok, k, groups, K: constexpr):
    """The stored scales [G, BLOCK_N] of _fp4_rows' tile at input k."""
    grp = k // 32 + groups
    return tl.load(s_rows + grp[:, None], mask=(grp * 32 < K)[:, None] & n_ok[None, :], other=0)


@device_function
def _fp4_rows(xs, w, s, n, N, k_lo, SPAN: constexpr, K: constexpr, S_STRIDE: constexpr, E8M0: constexpr,
              BLOCK_N: constexpr, BLOCK_K: constexpr, EARLY: constexpr = False):
    """A tuple of fp32 [BLOCK_N], one per x row of the tuple xs: rows n of an FP4 weight [N, K] times that x over
    inputs [k_lo, min(k_lo + SPAN, K)), w read as int32 words (8 e2m1 inputs each, input 8i + q in bits
    4q..4q+3), one scale per 32 inputs (4 words). Each tile is read and decoded once for all x rows; each
    row's sum is the one it gets alone (the same operations on the same layout, in the same order).

    Nibbles q and q + 4 of a word sit 16 bits apart, so one mask-and-shift places both in the fp16 bit
    layout: magnitude bits (exponent 2, mantissa 1) at fp16 bits 9-11, sign at bit 15. That fp16 is the
    e2m1 value times 2**-14 (e2m1's subnormal 0.5 lands on an fp16 subnormal, exactly), and 2**14 is
    folded into the scale.

    EARLY: the first tile's words and scales are loaded before the loop and pdl_wait runs while they are in
    flight, as _fp8_rows'; without it a tile's scales are loaded after its products, as they always were."""
    ROWS: constexpr = len(xs)
    G: constexpr = BLOCK_K // 32
    # Tiles are [G, BLOCK_N, 4]: a thread then holds one group of several rows, which share its x values.
    groups = tl.arange(0, G)
    words = groups[:, None] * 4 + tl.arange(0, 4)[None, :]
    n_ok = n < N
    w_rows = w + n.to(tl.int64)[None, :, None] * (K // 8)
    s_rows = s + n.to(tl.int64)[None, :] * S_STRIDE
    accs = (tl.zeros([G, BLOCK_N], dtype=tl.float32),) * ROWS
    if EARLY:
        wv, sq = _fp4_words(w_rows, n_ok, k_lo, words, K), _fp4_scales(s_rows, n_ok, k_lo, groups, K)
        pdl_wait()
    for k0 in range(0, SPAN, BLOCK_K):
        wi = (k_lo + k0) // 8 + words
        ok = wi < K // 8
        if not EARLY:
            wv = _fp4_words(w_rows, n_ok, k_lo + k0, words, K)
        elif k0 > 0:
            wv, sq = _fp4_words(w_rows, n_ok, k_lo + k0, words, K), _fp4_scales(s_rows, n_ok, k_lo + k0, groups, K)
        parts = (tl.zeros([G, BLOCK_N, 4], dtype=tl.float32),) * ROWS
        for q in tl.static_range(4):
            u = wv >> (4 * q)
            t = ((u & 0x70007) << 9) | ((u & 0x80008) << 12)
            lo = t.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
            hi = (t >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
            summed = ()
            for i in tl.static_range(ROWS):
                xs_i = xs[i] + wi * 8
                x_lo = tl.load(xs_i + q, mask=ok, other=0.0).to(tl.float32)
                x_hi = tl.load(xs_i + (q + 4), mask=ok, other=0.0).to(tl.float32)
                part = parts[i] + lo * x_lo[:, None, :]  # two statements: two fused multiply-adds
                part = part + hi * x_hi[:, None, :]
                summed = summed + (part,)
            parts = summed
        if not EARLY:
            sq = _fp4_scales(s_rows, n_ok, k_lo + k0, groups, K)
        sc = _scale(sq, E8M0) * 16384.0
        summed = ()
        for i in tl.static_range(ROWS):
            summed = summed + (accs[i] + tl.sum(parts[i], axis=2) * sc,)
        accs = summed
    return [tl.sum(acc, axis=0) for acc in accs]


@device_function
def _fp4_accumulate(part, u, x_lo, x_hi):
    """part [G, BLOCK_N, 4] plus the two inputs of word nibbles q and q + 4 (u: the words shifted right by 4q)
    times their x [G, 4] (_fp4_rows' decode, the same operations in the same order)."""
    t = ((u & 0x70007) << 9) | ((u & 0x80008) << 12)
    lo = t.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    hi = (t >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    part = part + lo * x_lo[:, None, :]  # two statements: two fused multiply-adds
    part = part + hi * x_hi[:, None, :]
    return part


@device_function
def _fp4_pair(x_row, wa, sa, wb, sb, n, N, k_lo, SPAN: constexpr, K: constexpr, S_STRIDE: constexpr,
              E8M0: constexpr, BLOCK_N: constexpr, BLOCK_K: constexpr, EARLY: constexpr = False):
    """_fp4_rows for one x row and two FP4 weights of one shape (an expert's gate and up) in one loop: each tile
    of both is loaded before either is summed (twice the bytes in flight a step) and each x value is loaded once
    for both. Each weight's sum is _fp4_rows' to the bit: the same decode, products and order. EARLY: as
    _fp4_rows' (both weights' first tiles in flight during pdl_wait)."""
    G: constexpr = BLOCK_K // 32
    groups = tl.arange(0, G)
    words = groups[:, None] * 4 + tl.arange(0, 4)[None, :]
    n_ok = n < N
    wa_rows, wb_rows = wa + n.to(tl.int64)[None, :, None] * (K // 8), wb + n.to(tl.int64)[None, :, None] * (K // 8)
    sa_rows, sb_rows = sa + n.to(tl.int64)[None, :] * S_STRIDE, sb + n.to(tl.int64)[None, :] * S_STRIDE
    acc_a = tl.zeros([G, BLOCK_N], dtype=tl.float32)
    acc_b = tl.zeros([G, BLOCK_N], dtype=tl.float32)
    if EARLY:
        va, vb = _fp4_words(wa_rows, n_ok, k_lo, words, K), _fp4_words(wb_rows, n_ok, k_lo, words, K)
        qa, qb = _fp4_scales(sa_rows, n_ok, k_lo, groups, K), _fp4_scales(sb_rows, n_ok, k_lo, groups, K)
        pdl_wait()
    for k0 in range(0, SPAN, BLOCK_K):
        k = k_lo + k0
        if not EARLY:
            va, vb = _fp4_words(wa_rows, n_ok, k, words, K), _fp4_words(wb_rows, n_ok, k, words, K)
        elif k0 > 0:
            va, vb = _fp4_words(wa_rows, n_ok, k, words, K), _fp4_words(wb_rows, n_ok, k, words, K)
            qa, qb = _fp4_scales(sa_rows, n_ok, k, groups, K), _fp4_scales(sb_rows, n_ok, k, groups, K)
        wi = k // 8 + words
        ok = wi < K // 8
        part_a = tl.zeros([G, BLOCK_N, 4], dtype=tl.float32)
        part_b = tl.zeros([G, BLOCK_N, 4], dtype=tl.float32)
        for q in tl.static_range(4):
            x_q = x_row + wi * 8
            x_lo = tl.load(x_q + q, mask=ok, other=0.0).to(tl.float32)
            x_hi = tl.load(x_q + (q + 4), mask=ok, other=0.0).to(tl.float32)
            part_a = _fp4_accumulate(part_a, va >> (4 * q), x_lo, x_hi)
            part_b = _fp4_accumulate(part_b, vb >> (4 * q), x_lo, x_hi)
        if not EARLY:
            qa, qb = _fp4_scales(sa_rows, n_ok, k, groups, K), _fp4_scales(sb_rows, n_ok, k, groups, K)
        sc_a = _scale(qa, E8M0) * 16384.0
        sc_b = _scale(qb, E8M0) * 16384.0
        acc_a = acc_a + tl.sum(part_a, axis=2) * sc_a
        acc_b = acc_b + tl.sum(part_b, axis=2) * sc_b
    return tl.sum(acc_a, axis=0), tl.sum(acc_b, axis=0)


def _qgemv2_kernel(x_ptr, w_ptr, s_ptr, e_ptr, y_ptr, p_ptr, tickets_ptr, N, rows, x_stride, w_expert_stride,
                   s_expert_stride, row_skew, K: constexpr, S_STRIDE: constexpr, FP4: constexpr, E8M0: constexpr,
                   ROWS_PER_X: constexpr, EXPERTS: constexpr, GROUP_N: constexpr, BLOCK_N: constexpr,
                   BLOCK_K: constexpr, SPLITS: constexpr, K_CHUNK: constexpr, FUSED_SUM: constexpr, ROWS: constexpr,
                   EARLY: constexpr, UNROLL: constexpr = False, PRE: constexpr = 1, RELEASE: constexpr = 0):
    """Grid (row blocks, SPLITS, row groups): a program reads its weight tile once for the ROWS rows of its group
    (the last group's missing rows repeat its last row: the same bits stored twice). SPLITS > 1: fp32 partials
    [rows, SPLITS, N] at p_ptr, summed into y_ptr by the last program of the (group, row block) (FUSED_SUM) or by
    _sum_splits_kernel after this launch. EXPERTS: one row per program (each row its own weight). EARLY (not
    EXPERTS, whose weights depend on the step's ids; launched with launch_pdl under DSV4_PDL): the first weight
    tile is loaded before pdl_wait (_fp8_rows, _fp4_rows), which releases the next kernel. RELEASE: the next kernel
    released first of all (pdl_release: linear's release)."""
    if RELEASE:
        pdl_release()
    if not EARLY:
        pdl_wait()
    nb = tl.program_id(0)
    split = tl.program_id(1)
    rs = _group_rows(tl.program_id(2), rows, ROWS)
    n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    x_group = x_ptr
    if GROUP_N > 0:
        x_group += ((nb * BLOCK_N) // GROUP_N) * K
    xs = [x_group + (r // ROWS_PER_X) * x_stride for r in rs]
    w, s = w_ptr, s_ptr
    if EXPERTS:
        e = tl.load(e_ptr + rs[0]).to(tl.int64)
        w += e * w_expert_stride
        s += e * s_expert_stride
    k_lo = split * K_CHUNK
    if FP4:
        accs = _fp4_rows(xs, w, s, n, N, k_lo, K_CHUNK, K, S_STRIDE, E8M0, BLOCK_N, BLOCK_K, EARLY)
    else:
        accs = _fp8_rows(xs, w, s, n, N, row_skew, k_lo, K_CHUNK, K, S_STRIDE, E8M0, BLOCK_N, BLOCK_K, EARLY,
                         UNROLL, PRE)
    if SPLITS == 1:
        for i in tl.static_range(ROWS):
            tl.store(y_ptr + rs[i] * N + n, accs[i].to(y_ptr.dtype.element_ty), mask=n < N)
    elif FUSED_SUM:
        ticket = tickets_ptr + tl.program_id(2) * tl.num_programs(0) + nb
        _reduce_splits(accs, tl.program_id(2), rows, p_ptr, y_ptr, ticket, split, n, N, SPLITS)
    else:
        for i in tl.static_range(ROWS):
            tl.store(p_ptr + (rs[i] * SPLITS + split) * N + n, accs[i], mask=n < N)


@device_function
def _group_rows(group, rows, ROWS: constexpr):
    """The int64 rows of a program's group: group * ROWS + i, past the last row that last row again (as
    _reduce_splits)."""
    rs = ()
    for i in tl.static_range(ROWS):
        rs = rs + (tl.minimum(group * ROWS + i, rows - 1).to(tl.int64),)
    return rs


@device_function
def _reduce_splits(accs, group, rows, p_ptr, y_ptr, ticket_ptr, split, n, N, SPLITS: constexpr):
    """Store this split's fp32 partials of outputs n of the rows of the group (accs[i] of its row i, as
    _group_rows); the program that finishes the (group, row block) last sums each row's SPLITS partials in
    ascending split order (as _sum_splits_kernel: the same bits whichever program came last), writes y in its
    dtype and puts the ticket back to 0 for the next launch; returns whether this program was that one. A row
    repeated in the group stores the same bits twice. The rows are summed in a loop (not unrolled): SPLITS loads per
    row of code, not per row of the group.

    The barrier makes every thread's partials stored before the ticket's release; the reducer's loads go
    to L2 (.cg): L1 is not coherent across SMs and could hold stale lines of the workspace."""
    ROWS: constexpr = len(accs)
    ok = n < N
    rs = _group_rows(group, rows, ROWS)
    for i in tl.static_range(ROWS):
        tl.store(p_ptr + (rs[i] * SPLITS + split) * N + n, accs[i], mask=ok)
    tl.debug_barrier()
    last = tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu") == SPLITS - 1
    if last:
        for j in range(ROWS):  # a loop variable of its own: static_range's i is a constexpr
            r = tl.minimum(group * ROWS + j, rows - 1).to(tl.int64)
            total = tl.zeros_like(accs[0])
            for sp in tl.static_range(SPLITS):
                total += tl.load(p_ptr + (r * SPLITS + sp) * N + n, mask=ok, other=0.0, cache_modifier=".cg")
            tl.store(y_ptr + r * N + n, total.to(y_ptr.dtype.element_ty), mask=ok)
        tl.store(ticket_ptr, 0)
    return last


def _sum_splits_kernel(p_ptr, y_ptr, N, SPLITS: constexpr, BLOCK: constexpr):
    """y[r, n] = sum over s of partials[r, s, n], s ascending: one order, so one result."""
    pdl_wait()
    r = tl.program_id(1).to(tl.int64)
    n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for sp in tl.static_range(SPLITS):
        acc += tl.load(p_ptr + (r * SPLITS + sp) * N + n, mask=n < N, other=0.0)
    tl.store(y_ptr + r * N + n, acc.to(y_ptr.dtype.element_ty), mask=n < N)

BLOCK_M = 16  # v3's rows per program: tl.dot's least, whatever the batch (padding rows are zeros)


@device_function
def _dot(a, b, acc, IEEE: constexpr):
    """acc + a @ b, fp32: tensor cores on x's dtype, or fp32 operands and products (IEEE)."""
    if IEEE:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


def _qgemv3_kernel(x_ptr, w_ptr, s_ptr, y_ptr, p_ptr, tickets_ptr, N, rows, x_stride, row_skew, K: constexpr,
                   S_STRIDE: constexpr, FP4: constexpr, E8M0: constexpr, GROUP_N: constexpr, BLOCK_M: constexpr,
                   BLOCK_N: constexpr, BLOCK_K: constexpr, SPLITS: constexpr, K_CHUNK: constexpr,
                   FUSED_SUM: constexpr, IEEE: constexpr):
    """Grid (N blocks, SPLITS, row tiles of BLOCK_M): y[m, n] over inputs [split * K_CHUNK, +K_CHUNK) by tl.dot.
    SPLITS > 1: fp32 partials [rows, SPLITS, N] at p_ptr, summed into y_ptr by the last program of the (row tile,
    N block) (FUSED_SUM) or by _sum_splits_kernel after this launch. The weight is stored (v3 never takes the routed
    experts'): its first K tile is loaded before pdl_wait (launched with launch_pdl under DSV4_PDL), the K loop goes
    on from the second; the dots are the loop's, in its order."""
    nb = tl.program_id(0)
    split = tl.program_id(1)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    x_rows = x_ptr + m.to(tl.int64)[:, None] * x_stride
    if GROUP_N > 0:
        x_rows += ((nb * BLOCK_N) // GROUP_N) * K
    k_lo = split * K_CHUNK
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if FP4:
        wq, sq = _fp4_stored(w_ptr, s_ptr, n, n_ok, k_lo, K, S_STRIDE, BLOCK_K)
        pdl_wait()
        acc = _fp4_dot3(acc, x_rows, m < rows, wq, sq, k_lo, K, E8M0, BLOCK_K, IEEE)
        for k0 in range(BLOCK_K, K_CHUNK, BLOCK_K):
            wq, sq = _fp4_stored(w_ptr, s_ptr, n, n_ok, k_lo + k0, K, S_STRIDE, BLOCK_K)
            acc = _fp4_dot3(acc, x_rows, m < rows, wq, sq, k_lo + k0, K, E8M0, BLOCK_K, IEEE)
    else:
        w_rows = w_ptr + n.to(tl.int64)[:, None] * K
        s_rows = s_ptr + ((n + row_skew) // 128).to(tl.int64) * S_STRIDE
        wq, sq = _fp8_tile3(w_rows, s_rows, n_ok, k_lo, K, BLOCK_K)
        pdl_wait()
        acc = _fp8_dots3(acc, x_rows, m < rows, _fp8_widened3(wq, x_rows.dtype.element_ty), sq, k_lo, K, E8M0, IEEE)
        for k0 in range(BLOCK_K, K_CHUNK, BLOCK_K):
            wq, sq = _fp8_tile3(w_rows, s_rows, n_ok, k_lo + k0, K, BLOCK_K)
            acc = _fp8_dots3(acc, x_rows, m < rows, _fp8_widened3(wq, x_rows.dtype.element_ty), sq, k_lo + k0, K,
                             E8M0, IEEE)
    if SPLITS == 1:
        _store_tile(acc, m, rows, y_ptr, n, N)
    elif FUSED_SUM:
        _reduce_tile(acc, m, rows, p_ptr, y_ptr, tickets_ptr + tl.program_id(2) * tl.num_programs(0) + nb, split, n,
                     N, SPLITS)
    else:
        _store_partials(acc, m, rows, p_ptr, split, n, N, SPLITS)


@device_function
def _fp4_dot3(acc, x_rows, m_ok, wq, sq, k, K: constexpr, E8M0: constexpr, BLOCK_K: constexpr, IEEE: constexpr):
    """acc plus x's rows times _qgemv3_kernel's FP4 tile at input k, from its stored bytes and scales (_fp4_stored):
    the scales folded into the tile (exact), one dot."""
    kk = k + tl.arange(0, BLOCK_K)
    xv = tl.load(x_rows + kk[None, :], mask=m_ok[:, None] & (kk < K)[None, :], other=0.0)
    return _dot(xv, tl.trans(_fp4_values(wq, sq, E8M0).to(xv.dtype)), acc, IEEE)


@device_function
def _fp8_tile3(w_rows, s_rows, n_ok, k, K: constexpr, BLOCK_K: constexpr):
    """_qgemv3_kernel's FP8 tile at input k as stored: a tuple of e4m3 [BLOCK_N, 128] per 128-wide block and a
    tuple of their scales [BLOCK_N]."""
    wq, sq = (), ()
    for j in tl.static_range(BLOCK_K // 128):
        kb = k + j * 128
        kk = kb + tl.arange(0, 128)
        wq = wq + (tl.load(w_rows + kk[None, :], mask=n_ok[:, None] & (kk < K)[None, :], other=0.0),)
        sq = sq + (tl.load(s_rows + kb // 128, mask=n_ok & (kb < K), other=0),)
    return wq, sq


@device_function
def _fp8_widened3(wq, dtype):
    """_fp8_tile3's e4m3 blocks in x's dtype (through fp32: exact), transposed for the dots."""
    wv = ()
    for j in tl.static_range(len(wq)):
        wv = wv + (tl.trans(wq[j].to(tl.float32).to(dtype)),)
    return wv


@device_function
def _fp8_dots3(acc, x_rows, m_ok, wv, sq, k, K: constexpr, E8M0: constexpr, IEEE: constexpr):
    """acc plus x's rows times _qgemv3_kernel's FP8 tile at input k (_fp8_tile3, widened by _fp8_widened3): each
    128-wide block's dot (fp32) times its scale, added in ascending order."""
    for j in tl.static_range(len(wv)):
        kk = k + j * 128 + tl.arange(0, 128)
        xv = tl.load(x_rows + kk[None, :], mask=m_ok[:, None] & (kk < K)[None, :], other=0.0)
        acc += _dot(xv, wv[j], tl.zeros(acc.shape, dtype=tl.float32), IEEE) * _scale(sq[j], E8M0)[None, :]
    return acc


@device_function
def _reduce_tile(acc, m, rows, p_ptr, y_ptr, ticket_ptr, split, n, N, SPLITS: constexpr):
    """_reduce_splits for a [rows m, outputs n] tile: store this split's fp32 partials (_store_partials); the program
    that finishes the (row tile, N block) last sums them (_sum_tile) and puts the ticket back to 0. Padding rows
    store and load nothing."""
    _store_partials(acc, m, rows, p_ptr, split, n, N, SPLITS)
    tl.debug_barrier()  # every thread's partials stored before the ticket's release
    if tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:
        _sum_tile(m, rows, p_ptr, y_ptr, n, N, SPLITS)
        tl.store(ticket_ptr, 0)


@device_function
def _store_tile(acc, m, rows, y_ptr, n, N):
    """y's [rows m, outputs n] tile in its dtype; padding rows store nothing."""
    tl.store(y_ptr + m.to(tl.int64)[:, None] * N + n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(m < rows)[:, None] & (n < N)[None, :])


@device_function
def _store_partials(acc, m, rows, p_ptr, split, n, N, SPLITS: constexpr):
    """This split's fp32 partials of a [rows m, outputs n] tile at p_ptr ([rows, SPLITS, N])."""
    at = m.to(tl.int64)[:, None] * SPLITS * N + n[None, :]
    tl.store(p_ptr + at + split * N, acc, mask=(m < rows)[:, None] & (n < N)[None, :])


@device_function
def _sum_tile(m, rows, p_ptr, y_ptr, n, N, SPLITS: constexpr):
    """The split sum of a [rows m, outputs n] tile (by the program that finished its (row group, N block) last):
    each element's SPLITS partials in ascending split order (as _sum_splits_kernel: the same bits whichever program
    came last), written to y in its dtype. The partials' loads go to L2 (.cg): L1 is not coherent across SMs and
    could hold stale lines of the workspace; the caller's barrier made every thread's partials stored before its
    ticket's release."""
    ok = (m < rows)[:, None] & (n < N)[None, :]
    at = m.to(tl.int64)[:, None] * SPLITS * N + n[None, :]
    total = tl.zeros([m.shape[0], n.shape[0]], dtype=tl.float32)
    for sp in tl.static_range(SPLITS):
        total += tl.load(p_ptr + at + sp * N, mask=ok, other=0.0, cache_modifier=".cg")
    tl.store(y_ptr + m.to(tl.int64)[:, None] * N + n[None, :], total.to(y_ptr.dtype.element_ty), mask=ok)


def supported(x: torch.Tensor, w: QWeight, rows: int) -> bool:
    if w.fmt not in ("fp8", "fp4") or rows > MAX_ROWS or w.scale is None or x.numel() == 0:
        return False
    if w.scale.dtype not in (torch.float8_e8m0fnu, torch.float32) or not (w.data.is_contiguous()
                                                                           and w.scale.is_contiguous()):
        return False
    if w.fmt == "fp8":
        return w.col0 % FP8_BLOCK == 0  # a K tile of 128 then has one scale per row
    words = CONFIG["kernel"] in ("v2", "v3", "mma")  # v2 (v3's routed experts) reads 8 inputs (4 bytes) at a time
    return w.col0 == 0 and w.row0 == 0 and w.shape[1] % (8 if words else 2) == 0


def block_n(kernel: str | None = None) -> int:
    """Rows per program of the kernel (CONFIG's when None: a grouped linear's group must hold whole blocks)."""
    return CONFIG[{"v2": "v2_block_n", "v3": "v3_block_n", "mma": "v3_block_n"}.get(kernel or CONFIG["kernel"],
                                                                                  "block_n")]


def _operands(w: QWeight, words: bool):
    """(data, scale) as the kernels read them: FP4 bytes (or int32 words of 8 inputs), scales as bytes."""
    scale = w.scale.view(torch.uint8) if w.scale.dtype == torch.float8_e8m0fnu else w.scale
    if w.fmt == "fp8":
        return w.data, scale
    return w.data.view(torch.int32 if words else torch.uint8), scale


def _launch(x, w: QWeight, y, rows: int, experts=None, rows_per_x: int = 1, group_n: int = 0,
            kernel: str | None = None, release: bool = False):
    kind = kernel or CONFIG["kernel"]
    if kind == "mma":  # the FP8 weights qgemv_mma takes; the others v3's (the routed experts v2's, as v3's)
        if experts is None and qgemv_mma.fits(x, w, group_n):
            return _launch_mma(x, w, y, rows, group_n)
        kind = "v3"
    if kind == "v3" and experts is None:
        return _launch3(x, w, y, rows, group_n)
    if kind in ("v2", "v3"):
        return _launch2(x, w, y, rows, experts, rows_per_x, group_n, release)
    N, K = w.shape[-2], (x.shape[-1] if not group_n else w.shape[-1])
    data, scale = _operands(w, words=False)
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


def _launch_mma(x, w: QWeight, y, rows: int, group_n: int):
    count = cdiv(rows, qgemv_mma.COLUMNS) * (w.shape[0] // (16 * qgemv_mma.CONFIG["rt"]))
    tickets = tickets_for(count, x.device) if qgemv_mma.splits(*w.shape) > 1 else None
    partials = qgemv_mma.launch(x, w, y, rows, group_n, tickets)
    if partials is not None:
        sum_splits(partials, y, rows)
    return y


def sum_splits(partials: torch.Tensor, y: torch.Tensor, rows: int) -> None:
    """y [rows, N] = the fp32 partials [rows, splits, N] summed in split order (_sum_splits_kernel)."""
    N, splits = y.shape[-1], partials.shape[1]
    launcher(_sum_splits_kernel, partials)[(cdiv(N, 1024), rows)](partials, y, N, SPLITS=splits, BLOCK=1024)


def splits_for(programs: int, tiles: int, target: int | None = None) -> int:
    """v2's split-K: CONFIG's, or doubled from 1 while the launch is short of `target` programs (CONFIG's
    "v2_programs" by default)."""
    splits = CONFIG["v2_split_k"]
    target = target or CONFIG["v2_programs"]
    if not splits:
        splits = 1
        while programs * splits < target and splits * 2 <= tiles:
            splits *= 2
    return max(1, min(splits, tiles))


def rows_per_program(rows: int, cap: int) -> int:
    """Rows that share one program's weight tiles: all of them up to the cap, as a power of two (fewer compiled
    variants; a group's missing rows repeat its last row). A row's bits do not depend on it."""
    return min(next_pow2(rows), max(1, cap))


def _launch2(x, w: QWeight, y, rows: int, experts, rows_per_x: int, group_n: int, release: bool = False):
    N, K = w.shape[-2], (x.shape[-1] if not group_n else w.shape[-1])
    fp4 = w.fmt == "fp4"
    data, scale = _operands(w, words=True)
    lead = data.dim() - 2
    c = CONFIG
    block_n, block_k, warps, programs = v2_tiles(N, K, fp4, experts is not None, group_n)
    tiles = cdiv(K, block_k)
    # The split depends on the weight alone, never on the rows: each row is then summed in one order
    # whatever the batch (a sequence's tokens do not depend on who shares its step).
    k_chunk = cdiv(tiles, splits_for(cdiv(N, block_n), tiles, programs)) * block_k
    splits = cdiv(K, k_chunk)  # no split left without inputs
    blocks = cdiv(N, block_n)
    per_program = 1 if experts is not None else rows_per_program(rows, c["v2_rows"])
    groups = cdiv(rows, per_program)
    partials = y if splits == 1 else torch.empty(rows, splits, N, dtype=torch.float32, device=x.device)
    tickets = tickets_for(groups * blocks, x.device) if splits > 1 and c["v2_fused_sum"] else None
    # A stored weight's first tile is loaded before the kernel waits for the previous one (DSV4_PDL); the routed
    # experts' weights depend on the step's ids.
    early = experts is None
    extra = {} if interpreting() else {"num_warps": warps}
    launcher(_qgemv2_kernel, x)[(blocks, splits, groups)](
        x, data, scale, experts if experts is not None else scale, y, partials,
        tickets if tickets is not None else partials, N, rows, x.stride(0),
        data.stride(0) if lead else 0, scale.stride(0) if lead else 0,
        w.row0 % FP8_BLOCK if not fp4 else 0,
        K=K, S_STRIDE=scale.shape[-1], FP4=fp4, E8M0=scale.dtype == torch.uint8, ROWS_PER_X=rows_per_x,
        EXPERTS=experts is not None, GROUP_N=group_n, BLOCK_N=block_n, BLOCK_K=block_k,
        SPLITS=splits, K_CHUNK=k_chunk, FUSED_SUM=tickets is not None, ROWS=per_program, EARLY=early,
        UNROLL=c["v2_unroll"] and not fp4 and k_chunk > block_k,
        **({"PRE": min(c["v2_early_tiles"], k_chunk // block_k)} if early and not fp4 and c["v2_unroll"]
           and c["v2_early_tiles"] > 1 else {}), **({"RELEASE": 1} if release and PDL else {}), **extra)
    if splits > 1 and tickets is None:
        sum_splits(partials, y, rows)
    return y


def _launch3(x, w: QWeight, y, rows: int, group_n: int):
    N, K = w.shape[-2], (x.shape[-1] if not group_n else w.shape[-1])
    fp4 = w.fmt == "fp4"
    data, scale = _operands(w, words=False)
    c = CONFIG
    block_n = c["v3_block_n"]
    block_k = c["v3_block_k_fp4"] if fp4 else c["v3_block_k_fp8"]
    blocks, tiles = cdiv(N, block_n), cdiv(K, block_k)
    k_chunk = cdiv(tiles, splits_for(blocks, tiles)) * block_k  # from the weight alone, as v2's
    splits = cdiv(K, k_chunk)
    groups = cdiv(rows, BLOCK_M)
    partials = y if splits == 1 else torch.empty(rows, splits, N, dtype=torch.float32, device=x.device)
    tickets = tickets_for(groups * blocks, x.device) if splits > 1 and c["v2_fused_sum"] else None
    # v3 takes stored weights only (the routed experts stay on v2): the first tile is loaded before the wait
    extra = {} if interpreting() else {"num_warps": c["v3_num_warps"]}
    launcher(_qgemv3_kernel, x)[(blocks, splits, groups)](
        x, data, scale, y, partials, tickets if tickets is not None else partials, N, rows, x.stride(0),
        w.row0 % FP8_BLOCK if not fp4 else 0,
        K=K, S_STRIDE=scale.shape[-1], FP4=fp4, E8M0=scale.dtype == torch.uint8, GROUP_N=group_n,
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k, SPLITS=splits, K_CHUNK=k_chunk,
        FUSED_SUM=tickets is not None, IEEE=x.dtype == torch.float32 or interpreting(), **extra)
    if splits > 1 and tickets is None:
        sum_splits(partials, y, rows)
    return y


TICKETS = 1 << 16  # int32 split counters per device: rows * row blocks of any split launch (decode: a few thousand)
_tickets: dict[tuple[torch.device, int], torch.Tensor] = {}


def tickets_for(count: int, device: torch.device) -> torch.Tensor | None:
    """The device's zeroed split tickets (a kernel that takes them leaves them zero again), or None where
    the caller must sum its splits in a second launch: more tickets than TICKETS, or none made yet and a
    CUDA graph capture under way.

    One buffer per device and lane (dsv4.kernels.lanes: the launches on a device's second stream, which may run
    beside the main stream's, count in a buffer of their own), made once outside any capture and never freed: a
    captured graph keeps its address, and a buffer from a capture's private pool would be freed with that graph.
    Made by the first eager launch (dsv4.replay warms up eagerly before it captures), both lanes' at once. The
    launches of one stream share it: one at a time, each leaving it zero for the next."""
    if count > TICKETS:
        return None
    buf = _tickets.get((device, lanes.current))
    if buf is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        with torch.inference_mode(False):  # normal tensors, whichever mode made them; every lane's at once (the
            for lane in (0, 1):            # lane runs only in a capture)
                _tickets[device, lane] = torch.zeros(TICKETS, dtype=torch.int32, device=device)
        buf = _tickets[device, lanes.current]
    return buf


def linear(x: torch.Tensor, w: QWeight, out: torch.Tensor | None = None, kernel: str | None = None,
           release: bool = False) -> torch.Tensor:
    """x [..., K] -> [..., N], written into out (contiguous, rows x N, x's dtype) when given. kernel: "v2" or "v3"
    for this call (dsv4.model.rows.step_gemv: a prefill chunk's), CONFIG's when None. release: the caller's word that
    the next kernel reads before its wait nothing the kernel before this one writes; v2 then releases it first of
    all (pdl_release: it may start while that kernel runs), the other kernels after their wait as always."""
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    y = _destination(out, x2.shape[0], w.shape[0], x.dtype, x.device)
    return _launch(x2, w, y, x2.shape[0], kernel=kernel, release=release).view(*x.shape[:-1], w.shape[0])


def _destination(out: torch.Tensor | None, rows: int, N: int, dtype: torch.dtype, device) -> torch.Tensor:
    """A kernel's output [rows, N]: out (a caller's buffer, e.g. an all-reduce door's payload) or a new tensor."""
    if out is None:
        return torch.empty(rows, N, dtype=dtype, device=device)
    if out.numel() != rows * N or out.dtype != dtype or not out.is_contiguous() or out.device != torch.device(device):
        raise ValueError(f"out {tuple(out.shape)} {out.dtype}: want {rows} x {N} contiguous {dtype} on {device}")
    return out.view(rows, N)


def grouped_linear(x: torch.Tensor, w: QWeight, groups: int, kernel: str | None = None) -> torch.Tensor:
    """x [T, groups * Kg], w [groups * O, Kg] (block diagonal) -> [T, groups * O]. kernel: as linear's."""
    x = x.contiguous()
    y = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
    return _launch(x, w, y, x.shape[0], group_n=w.shape[0] // groups, kernel=kernel)


def expert_linear(x: torch.Tensor, stack: QWeight, experts: torch.Tensor, rows_per_x: int) -> torch.Tensor:
    """Row r of the output: expert experts[r] of `stack` [E, N, K] applied to x[r // rows_per_x]."""
    x = x.contiguous()
    rows = experts.numel()
    y = torch.empty(rows, stack.shape[0], dtype=x.dtype, device=x.device)
    return _launch(x, stack, y, rows, experts=experts.contiguous(), rows_per_x=rows_per_x)
