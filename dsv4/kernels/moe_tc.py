"""The routed experts of a rows-alone step on the tensor cores: a prefill chunk's, by default.

The pair kernels (dsv4.kernels.moe) run each (token, expert) pair as its own GEMV on the CUDA cores.
A server's prefill wave of 16 prompts of 63 tokens makes 6,048 of them a layer (~24 an expert), each
unpacking its expert's FP4 bytes and paying its own multiply-adds: 89 % of the wave (session 12 call
6). Here the pairs are sorted by local expert and cut into tiles of BLOCK_M pairs of one expert (as
dsv4.kernels.prefill_moe cuts a long prefill's), and a program multiplies its tile by a BLOCK_N slice
of the expert's weight on the tensor cores, each weight word unpacked once for all of its rows
(_words_dot). At one token a sequence (a decode step, ~1.2 pairs an expert at 16 sequences) the pair
kernels stay faster, so by default only prefill chunks come here (CONFIG mode).

Batch invariance: one tile shape whatever the step (CONFIG, fixed for the process), so a pair's sums are
the tensor cores' over its own row of the tile and the weight, in the K loop's order, whatever other
pairs share its tile or where it sits in it: a sequence's bits do not depend on who shares its step
(batched == solo), as with the pair kernels. They are not the pair kernels' bits (another summation
order), so the choice follows the step's kind (tokens a sequence), never a launch's size.

Launches: the plan (one program: the pairs sorted by expert, each group's end, the tiles), gate/up with
the SwiGLU activation (h in sorted order), down with each pair's routing weight (each pair's term, in pair
order), and the sum of a token's terms in routing order with the shared expert's output added: the
rounding of dsv4.kernels.moe's kernel 2 (each expert's output rounded, its product with the weight
rounded, the fp32 sum rounded, plus the shared output rounded once). A launch of more pairs than one
program plans (a prefill wave) plans with torch ops instead: the same plan.
"""

import os

import torch

from ..formats import QWeight
from . import cdiv, device_function, interpreting, launcher, next_pow2, pdl_wait
from .prefill_moe import _scale, _swiglu, schedule
from .qgemv import _destination, _dot
from .qgemv import _scale as _scale_fp32

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # session 13 calls 2-4 (benchmarks/RESULTS.md): its CUDA tests, graph == eager, the gate on mini
# mode (DSV4_MOE_TC): "chunks", a prefill chunk's experts (more than one token a sequence: dsv4.model.moe); "all",
# every rows-alone step's, decode too; "off". block_m: pairs a tile (16, tl.dot's least); block_n / block_k: a
# program's outputs and each K step's inputs (block_k / 8 >= 16: a plane's dot); warps and pipeline stages;
# plan_pairs: the most pairs the one-program plan takes (more: torch's ops). Session 13 call 3 (moe_bench, one
# Flash layer's routed experts): 1 token 108-152 us (pair kernels 47), 16 tokens 865-960 us (pair kernels 602), a
# 16 x 63 prefill wave on mini 0.101 s (pair kernels 0.27): hence chunks. (block_n, warps and stages leave each sum's
# order as it is, as call 2 found bit for bit in the first loop form; block_k changes each plane's dot.)
# plan_fixed (on; DSV4_MOE_TC_PLAN_FIXED=0 turns it off): the one-program plan compiled once, its sort and tile ranges
# at plan_pairs' sizes whatever a wave's pairs (the same plan, entry for entry), where each power of two of a wave's
# pairs would compile its own: a server's first wave of a new size then waits on that compile (3-5 s on an H200),
# and so does every request behind it (session 15 call 1: with 64-token prompts the plan compiled at 512 pairs, 2.99 s,
# and at 1,024, 4.86 s; session 14's concurrency-4 stall of ~3.8 s between two waves). On: one compile, 4.4 s, at the
# first prefill wave. Not under Triton's interpreter (CPU), which compiles nothing: there a plan at its wave's sizes
# is the same plan, where one sized for 1,024 pairs sorts them all in numpy (the CPU suite's prefills: ~2 minutes).
# long (DSV4_MOE_TC_LONG=0 turns it off): a long prefill chunk's experts (past a short chunk's tokens: not rows alone,
# so one chunk's sums may follow its own size) here too, in tiles of the first entry's (block_m, block_n) whose bound
# holds the chunk's pairs per expert (tokens * k / routed experts, the pairs each local expert gets on average on any
# rank); past the last bound, the dense path (moe_prefill.grouped_experts: the local experts dequantised whole, one
# grouped matmul). Session 21 call 1 (benchmarks/prefill_moe_bench.py, one H200, ms a layer; mini's 256 experts on one
# GPU, a Flash rank's 128 of them): the dense path 12.8 / 6.55 ms whatever the chunk; here 2.8 at 128 tokens, 3.2 at
# 256, 3.6 at 512 (16 rows, 128 columns); call 2 (mini): 4.4 at 1,024 (32 rows, 128 columns), 5.8 at 2,048 and 10.6
# at 4,096 (64 rows, 128 columns; dense 13.0 and 12.9): at most ~1/4 of the dense path's time up to 512 tokens, and
# none of its multi-GB stacks (mini's prefill peak 30.1 -> 22.2 GiB). 128 rows a tile lost at every size measured.
# order (DSV4_MOE_TC_ORDER; "auto" by default): how a K step's products reach the tensor cores. "planes": eight dots
# of 16 inputs, each one nibble position of 16 words (a word decoded in the registers it was loaded into); compiled,
# each dot's wgmma waits for the previous one (its A operand in registers), 16 issue-and-wait rounds a K step for
# gate and up (tests/compile_kernels.py's TTGIR, session 21). "planes_one": one dot a K step, the tile and x's inputs
# permuted into the planes' order: "planes"' bits (tests/test_moe_tc.py on the GPU, session 22 call 1). "natural":
# the planes joined back into the [BLOCK_N, BLOCK_K] tile in input order and one dot a K step over x's rows as they
# lie: other bits (each k16 instruction sums 16 consecutive inputs), the same alone and batched. "auto": planes_one
# for 16-row tiles, planes for more rows, as session 22 call 1 measured them (benchmarks/prefill_moe_bench.py, ms a
# layer, the same bits in every arm): 16 x 128 tiles, mini's 256 experts, planes -> planes_one 2.95 -> 2.68 at 128
# tokens, 3.92 -> 3.65 at 512, a Flash rank's 128 experts 1.68 -> 1.41 at 128; 32 x 128 tiles 4.44 -> 4.64 at 1,024
# and 64 x 128 11.3 -> 19.3 at 4,096 (more rows a tile: the one dot's permuted operands cost more than the waits
# they remove). natural was no faster than planes where it won at all (tc_nat arms) and changes the bits: not used.
# block_n 128 (64 until session 22): a pair's sums do not depend on it (bit_equal_tc in every arm), and short chunks'
# 16 x 128 tiles beat 16 x 64 at every size measured (mini 64 tokens 2.25 -> 2.20 ms, 128: 3.05 -> 2.68, with
# planes_one; a Flash rank's 128 tokens 1.72 -> 1.41).
# bf16_decode (DSV4_MOE_TC_BF16_DECODE=0 turns it off): bf16 activations with ue8m0 scales take _plane's bf16 decode
# (a nibble placed at bf16's bits, two exact bf16 products) instead of the fp16 placement's fp32 round trip; the same
# operands reach the tensor cores, so the same bits (tests/test_moe_tc.py on the GPU; mini's prefill logits_sha at 64
# to 4,096 tokens unchanged). A short chunk's experts are issue-bound by the decode (sm_90 SASS of the 16 x 128
# gate/up K step: 1,623 -> 1,165 instructions). Session 23 call 2 (prefill_moe_bench, ms a layer): mini's 256 experts
# 2.14 / 2.72 / 3.94 -> 1.89 / 2.42 / 3.52 at 64 / 128 / 512 tokens (16 x 128), 4.72 -> 4.41 at 1,024 (32 x 128),
# 11.86 -> 11.49 at 4,096 (64 x 128); a Flash rank's 128 experts 1.59 / 2.16 -> 1.29 / 1.87 at 128 / 512.
LONG = ((12, 16, 128), (24, 32, 128), (96, 64, 128)) if os.environ.get("DSV4_MOE_TC_LONG", "1") == "1" else ()
CONFIG = {"mode": os.environ.get("DSV4_MOE_TC", "chunks"), "block_m": 16, "block_n": 128, "block_k": 128,
          "num_warps": 4, "num_stages": 3, "plan_pairs": 1024,
          "plan_fixed": os.environ.get("DSV4_MOE_TC_PLAN_FIXED", "1") == "1" and not interpreting(), "long": LONG,
          "order": os.environ.get("DSV4_MOE_TC_ORDER", "auto"),
          "wave_tiles": os.environ.get("DSV4_MOE_TC_WAVE_TILES", "1") == "1",
          "bf16_decode": os.environ.get("DSV4_MOE_TC_BF16_DECODE", "1") == "1"}
ORDERS = ("planes", "natural", "planes_one")  # the kernel's ORDER, by index; CONFIG order also takes "auto"
MODES = ("off", "chunks", "all")


@device_function
def _count_at_most(sorted_ptr, q, n, LOG: constexpr):
    """For each value of q: how many of sorted_ptr[0 .. n) (ascending) are <= it (a binary search by halving
    steps, 2**LOG >= n)."""
    lo = q * 0
    for b in tl.static_range(LOG, -1, -1):
        cand = lo + (1 << b)
        inside = cand <= n
        take = inside & (tl.load(sorted_ptr + cand - 1, mask=inside, other=0) <= q)
        lo = tl.where(take, cand, lo)
    return lo


def _plan_kernel(ids_ptr, order_ptr, ends_ptr, tile_expert_ptr, tile_row_ptr, scratch_ptr, P, first, n_local, TILES,
                 P2: constexpr, N2: constexpr, T2: constexpr, BM: constexpr, LOG_P: constexpr, LOG_N: constexpr):
    """One program: pair i (ids flat, P of them) keyed by its local expert (other ranks' last); order = the pairs
    sorted by key, ties in pair order (unique keys key * P2 + i); ends[g] = the pairs of experts <= g; tile j of
    BM rows: its expert (n_local past the groups' own) and first sorted row. scratch: [P2 + 3 * N2] int32, read
    back by this program after a barrier (the sorted keys, then each group's first row, tiles and cumulative
    tiles)."""
    pdl_wait()
    i = tl.arange(0, P2)
    ok = i < P
    e = tl.load(ids_ptr + i, mask=ok, other=0).to(tl.int32) - first
    key = tl.where(ok, tl.where((e >= 0) & (e < n_local), e, n_local), n_local + 1)
    v = tl.sort(key * P2 + i)
    tl.store(order_ptr + i, v % P2, mask=ok)
    tl.store(scratch_ptr + i, v // P2)
    tl.debug_barrier()
    g = tl.arange(0, N2)
    mine = g < n_local
    ends = _count_at_most(scratch_ptr, g, P, LOG_P)
    starts = _count_at_most(scratch_ptr, g - 1, P, LOG_P)
    tiles = tl.where(mine, (ends - starts + BM - 1) // BM, 0)
    cum = tl.cumsum(tiles, 0)
    tl.store(ends_ptr + g, ends, mask=mine)
    firsts, counts, cums = scratch_ptr + P2, scratch_ptr + P2 + N2, scratch_ptr + P2 + 2 * N2
    tl.store(firsts + g, starts)
    tl.store(counts + g, tiles)
    tl.store(cums + g, cum)
    tl.debug_barrier()
    j = tl.arange(0, T2)
    expert = _count_at_most(cums, j, n_local, LOG_N)
    ec = tl.minimum(expert, n_local - 1)
    row = tl.load(firsts + ec) + (j - (tl.load(cums + ec) - tl.load(counts + ec))) * BM
    tl.store(tile_expert_ptr + j, expert, mask=j < TILES)
    tl.store(tile_row_ptr + j, row, mask=j < TILES)


if CONFIG["plan_fixed"]:  # read at import, as the kernel is compiled once: its sizes must not specialise it either
    _plan_kernel.do_not_specialize = ("P", "TILES")


@device_function
def _words_dot(acc, a_ptr, a_rows, r_ok, w_ptr, s_ptr, cols, c_ok, k0, K: constexpr, S_STRIDE: constexpr,
               E8M0: constexpr, IEEE: constexpr, BLOCK_K: constexpr, ORDER: constexpr, BF16: constexpr):
    """CONFIG order's K step (ORDER: its index in ORDERS; BF16: _plane's bf16 decode)."""
    if ORDER != 0:
        return _words_dot_one(acc, a_ptr, a_rows, r_ok, w_ptr, s_ptr, cols, c_ok, k0, K, S_STRIDE, E8M0, IEEE,
                              BLOCK_K, ORDER == 1, BF16)
    return _words_dot_planes(acc, a_ptr, a_rows, r_ok, w_ptr, s_ptr, cols, c_ok, k0, K, S_STRIDE, E8M0, IEEE,
                             BLOCK_K, BF16)


@device_function
def _words_dot_planes(acc, a_ptr, a_rows, r_ok, w_ptr, s_ptr, cols, c_ok, k0, K: constexpr, S_STRIDE: constexpr,
                      E8M0: constexpr, IEEE: constexpr, BLOCK_K: constexpr, BF16: constexpr):
    """acc [BLOCK_N, BLOCK_M] + (the FP4 weight's rows `cols`, inputs k0 .. k0 + BLOCK_K) @ (a's rows a_rows)^T on the
    tensor cores. The weight is the MMA's wide operand (its rows fill the tensor cores' 64, the pairs are the narrow
    side), read as int32 words (8 inputs each, input 8w + q in bits 4q..4q+3) and taken apart into eight planes,
    plane q the inputs k0 + 8w + q, each times its scale (one per 4 words: a [BLOCK_N, G, 4] tile broadcast over
    the 4) and dotted with the inputs it multiplies: a word is decoded in the registers it was loaded into, with
    no interleave (nibbles q and q + 4, 16 bits apart, by one mask-and-shift: qgemv._fp4_rows's decode)."""
    words, scale = _words(w_ptr, s_ptr, cols, c_ok, k0, K, S_STRIDE, E8M0, BLOCK_K, BF16)
    w8 = k0 + 8 * tl.arange(0, BLOCK_K // 8)
    ok = (w8 < K)[:, None] & r_ok[None, :]
    at = a_ptr + a_rows[None, :] * K + w8[:, None]
    dt = a_ptr.dtype.element_ty
    for q in tl.static_range(4):
        lo, hi = _plane(words, q, scale, BF16)
        acc = _dot(tl.reshape(lo, [lo.shape[0], BLOCK_K // 8]).to(dt), tl.load(at + q, mask=ok, other=0.0), acc, IEEE)
        acc = _dot(tl.reshape(hi, [hi.shape[0], BLOCK_K // 8]).to(dt), tl.load(at + q + 4, mask=ok, other=0.0), acc,
                   IEEE)
    return acc


@device_function
def _words(w_ptr, s_ptr, cols, c_ok, k0, K: constexpr, S_STRIDE: constexpr, E8M0: constexpr, BLOCK_K: constexpr,
           BF16: constexpr):
    """A K step's stored weight: int32 words [BLOCK_N, G, 4] (G = BLOCK_K // 32 scale groups of 4 words) of rows
    `cols`, and each group's scale [BLOCK_N, G, 1]: times 2**14 (_plane's fp16 placement), or with BF16 (ue8m0
    scales) the bf16 of the scale itself (its byte is bf16's exponent field: exact, 0 -> 0 as _scale_fp32)."""
    G: constexpr = BLOCK_K // 32
    gi = tl.arange(0, G)
    wi = k0 // 8 + gi[:, None] * 4 + tl.arange(0, 4)[None, :]
    rows64 = cols.to(tl.int64)
    words = tl.load(w_ptr + rows64[:, None, None] * (K // 8) + wi[None, :, :],
                    mask=c_ok[:, None, None] & (wi < K // 8)[None, :, :], other=0)
    sc = tl.load(s_ptr + rows64[:, None] * S_STRIDE + k0 // 32 + gi[None, :], mask=c_ok[:, None], other=0)
    if BF16:
        scale = (sc.to(tl.int16) << 7).to(tl.bfloat16, bitcast=True)
    else:
        scale = _scale_fp32(sc, E8M0) * 16384.0
    return words, scale[:, :, None]


@device_function
def _plane(words, q: constexpr, scale, BF16: constexpr):
    """Nibbles q and q + 4 of each word (inputs 8w + q and 8w + q + 4) times their scales: fp32 (lo, hi), as
    _words_dot_planes decodes them; with BF16, bf16 (lo, hi) of the same values (each exact in bf16, so the
    tensor cores see the fp32 path's values rounded to bf16: the same operands, the same bits)."""
    if BF16:
        # Magnitude bits at bf16 bits 6-8 and the sign at 15: the bf16 of e2m1 times 2**-126 (0.5 a subnormal; a
        # bf16 product keeps subnormals: no ftz form exists). Two exact bf16 products: times 2**126, times the
        # scale. Three integer operations and two packed multiplies a pair of inputs, where the fp16 placement's
        # conversions to fp32, fp32 products and roundings back cost about six instructions an input (sm_90 SASS
        # of the 16 x 128 gate/up K step, session 23): a short chunk's experts are bound by those instructions.
        SIGNS: constexpr = -0x7FFF8000  # bits 15 and 31 (0x80008000 as an int32)
        if q == 0:
            t = ((words << 6) & 0x01C001C0) | ((words << 12) & SIGNS)
        elif q == 1:
            t = ((words << 2) & 0x01C001C0) | ((words << 8) & SIGNS)
        elif q == 2:
            t = ((words >> 2) & 0x01C001C0) | ((words << 4) & SIGNS)
        else:
            t = ((words >> 6) & 0x01C001C0) | (words & SIGNS)
        unbias = tl.full([1, 1, 1], 2.0 ** 126, tl.bfloat16)
        lo = t.to(tl.int16).to(tl.bfloat16, bitcast=True) * unbias * scale
        hi = (t >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True) * unbias * scale
    else:
        u = words >> (4 * q)
        t = ((u & 0x70007) << 9) | ((u & 0x80008) << 12)
        lo = t.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32) * scale
        hi = (t >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32) * scale
    return lo, hi


@device_function
def _words_dot_one(acc, a_ptr, a_rows, r_ok, w_ptr, s_ptr, cols, c_ok, k0, K: constexpr, S_STRIDE: constexpr,
                   E8M0: constexpr, IEEE: constexpr, BLOCK_K: constexpr, NATURAL: constexpr, BF16: constexpr):
    """_words_dot_planes's products as one tl.dot a K step, not eight: the tensor cores' instructions of a step issue
    back to back (the eight dots wait for each other, their A operand in registers). The eight planes are joined
    back into a [BLOCK_N, BLOCK_K] weight tile. NATURAL: its inputs in their own order (input 8w + j, nibble j of
    word w) and x's rows read as they lie, one contiguous load; each k16 instruction then sums 16 consecutive
    inputs: other bits than the planes'. Else the planes' order (plane by plane, lo before hi, as
    _words_dot_planes dots them) and x's inputs gathered in it: each k16 instruction sums one plane's 16 inputs
    in _words_dot_planes's sequence, the same bits."""
    words, scale = _words(w_ptr, s_ptr, cols, c_ok, k0, K, S_STRIDE, E8M0, BLOCK_K, BF16)
    lo0, hi0 = _plane(words, 0, scale, BF16)
    lo1, hi1 = _plane(words, 1, scale, BF16)
    lo2, hi2 = _plane(words, 2, scale, BF16)
    lo3, hi3 = _plane(words, 3, scale, BF16)
    # [BLOCK_N, G, 4, j2, j1, j0] = nibble j = 4 j2 + 2 j1 + j0 of word (g, i): lo_q is nibble q, hi_q nibble q + 4
    tile = tl.join(tl.join(tl.join(lo0, hi0), tl.join(lo2, hi2)), tl.join(tl.join(lo1, hi1), tl.join(lo3, hi3)))
    dt = a_ptr.dtype.element_ty
    kk = tl.arange(0, BLOCK_K)
    if NATURAL:
        k = k0 + kk
    else:
        # position p * (BLOCK_K // 8) + w holds plane p = 2q + h (lo_0, hi_0, lo_1, ...), q = j0 + 2 j1, h = j2:
        # the tile's dims in the order (j1, j0, j2, g, i), and x's input 8w + q + 4h there
        tile = tl.permute(tile, (0, 4, 5, 3, 1, 2))
        p, w = kk // (BLOCK_K // 8), kk % (BLOCK_K // 8)
        k = k0 + 8 * w + p // 2 + 4 * (p % 2)
    x = tl.load(a_ptr + a_rows[None, :] * K + k[:, None], mask=(k < K)[:, None] & r_ok[None, :], other=0.0)
    return _dot(tl.reshape(tile, [tile.shape[0], BLOCK_K]).to(dt), x, acc, IEEE)


def _experts_kernel(a_ptr, order_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, wt_ptr, out_ptr, tile_expert_ptr, tile_row_ptr,
                    ends_ptr, N, n_local, w_expert_stride, s_expert_stride, limit, K: constexpr, S_STRIDE: constexpr,
                    E8M0: constexpr, TOPK: constexpr, SWIGLU: constexpr, IEEE: constexpr, BLOCK_M: constexpr,
                    BLOCK_N: constexpr, BLOCK_K: constexpr, NUM_STAGES: constexpr, ORDER: constexpr,
                    BF16: constexpr):
    """Grid (tiles, column blocks of N); tile j: sorted rows tile_row[j].. of expert tile_expert[j] (n_local: none).
    SWIGLU (gate/up): a = x, row r's input x[order[r] // TOPK]; out = h [P, N] at sorted row r: the activation of
    w1 and w3's products. Else (down): a = h, row r's input h[r]; out = terms [P, N] fp32 at pair order[r]: w2's
    product rounded to h's dtype, times the pair's routing weight wt[order[r]], rounded. w1/w3: int32 words
    (strides in words); the K loop's tiles are [outputs, rows] (_words_dot)."""
    pdl_wait()
    tile = tl.program_id(0)
    e = tl.load(tile_expert_ptr + tile)
    if e < n_local:
        g = e.to(tl.int64)
        rows = tl.load(tile_row_ptr + tile) + tl.arange(0, BLOCK_M)
        r_ok = rows < tl.load(ends_ptr + g)
        pair = tl.load(order_ptr + rows, mask=r_ok, other=0).to(tl.int64)
        a_rows = pair // TOPK if SWIGLU else rows.to(tl.int64)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        c_ok = cols < N
        dt = a_ptr.dtype.element_ty
        w1, s1 = w1_ptr + g * w_expert_stride, s1_ptr + g * s_expert_stride
        w3, s3 = w3_ptr + g * w_expert_stride, s3_ptr + g * s_expert_stride
        acc1 = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        acc3 = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
            acc1 = _words_dot(acc1, a_ptr, a_rows, r_ok, w1, s1, cols, c_ok, k0, K, S_STRIDE, E8M0, IEEE, BLOCK_K,
                              ORDER, BF16)
            if SWIGLU:
                acc3 = _words_dot(acc3, a_ptr, a_rows, r_ok, w3, s3, cols, c_ok, k0, K, S_STRIDE, E8M0, IEEE,
                                  BLOCK_K, ORDER, BF16)
        gate, up = tl.trans(acc1), tl.trans(acc3)
        ok = r_ok[:, None] & c_ok[None, :]
        if SWIGLU:
            tl.store(out_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :], _swiglu(gate, up, dt, limit).to(dt),
                     mask=ok)
        else:
            weight = tl.load(wt_ptr + pair, mask=r_ok, other=0.0).to(tl.float32)
            term = (gate.to(dt).to(tl.float32) * weight[:, None]).to(dt).to(tl.float32)
            tl.store(out_ptr + pair[:, None] * N + cols[None, :], term, mask=ok)


def _sum_kernel(terms_ptr, ids_ptr, add_ptr, y_ptr, D, first, n_local, TOPK: constexpr, ADD: constexpr,
                BLOCK: constexpr):
    """Grid (blocks of D, T): y[t] = token t's terms of local experts summed in routing order (fp32), rounded; with
    ADD, plus add[t], rounded again. (dsv4.kernels.moe sums every term, 0 for another rank's expert: the same
    bits, since adding +0.0 to a sum that starts at +0.0 changes none.)"""
    pdl_wait()
    t = tl.program_id(1).to(tl.int64)
    n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    dt = y_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(TOPK):
        e = tl.load(ids_ptr + t * TOPK + j).to(tl.int64) - first
        if (e >= 0) & (e < n_local):
            acc += tl.load(terms_ptr + (t * TOPK + j) * D + n, mask=n < D, other=0.0)
    if ADD:
        acc = acc.to(dt).to(tl.float32) + tl.load(add_ptr + t * D + n, mask=n < D, other=0.0).to(tl.float32)
    tl.store(y_ptr + t * D + n, acc.to(dt), mask=n < D)


def supported(x: torch.Tensor, stacks: list[QWeight]) -> bool:
    """x [T, D] of a float dtype, stacks w1, w3 [n, I, D] and w2 [n, D, I] FP4 as prefill_moe reads them, D and I
    at least a K step (compiled, a plane's dot needs 16 words)."""
    from . import prefill_moe

    w1 = stacks[0]
    return (x.dim() == 2 and x.shape[0] > 0 and prefill_moe.supported(x, stacks)
            and (interpreting() or min(w1.shape) >= CONFIG["block_k"]))


def chosen(x: torch.Tensor, stacks: list[QWeight], tokens: int) -> bool:
    """Whether a rows-alone step of `tokens` tokens a sequence runs these experts here (CONFIG mode: the step's kind
    decides, never how many sequences share it)."""
    mode = CONFIG["mode"]
    if mode not in MODES:
        raise ValueError(f"DSV4_MOE_TC={mode!r}: allowed {list(MODES)}")
    return (mode == "all" or (mode == "chunks" and tokens > 1)) and supported(x, stacks)


def long_tiles(x: torch.Tensor, stacks: list[QWeight], pairs_per_expert: float) -> tuple[int, int] | None:
    """(block_m, block_n) for a long prefill chunk's experts (CONFIG long: the first entry whose bound holds
    pairs_per_expert), or None: the dense path (past every bound, mode off, or stacks the kernel does not read)."""
    if CONFIG["mode"] == "off":
        return None
    for bound, block_m, block_n in CONFIG["long"]:
        if pairs_per_expert <= bound:
            return (block_m, block_n) if supported(x, stacks) else None
    return None


def tiles_bound(pairs: int, n_local: int, block_m: int | None = None) -> int:
    """The tiles a plan lists: every real tile holds a pair, and there are at most cdiv(pairs, bm) + n_local."""
    return min(pairs, cdiv(pairs, block_m or CONFIG["block_m"]) + n_local)


def plan(ids: torch.Tensor, first: int, n_local: int, block_m: int | None = None) -> tuple[torch.Tensor, ...]:
    """(order [P], ends [n_local], tile expert [tiles], tile row [tiles]), int32, for ids [T, k] (global ids; P =
    T * k): the pairs sorted by local expert (other ranks' last), ties in pair order; each expert's end in that
    order; each tile's expert (n_local past the real ones) and first sorted row, tiles of block_m pairs (CONFIG's by
    default). On the device: no host sync."""
    P, bm = ids.numel(), block_m or CONFIG["block_m"]
    tiles = tiles_bound(P, n_local, bm)
    if P > CONFIG["plan_pairs"]:
        flat = ids.reshape(-1).long() - first
        key = torch.where((flat >= 0) & (flat < n_local), flat, n_local)
        key, order = torch.sort(key, stable=True)
        ends = torch.searchsorted(key, torch.arange(n_local, device=key.device), right=True, out_int32=True)
        expert, row = schedule(ends, P, bm, tiles)
        return order.to(torch.int32), ends, expert, row
    dev = ids.device
    P2, N2, T2 = next_pow2(P), next_pow2(n_local), next_pow2(tiles)
    if CONFIG["plan_fixed"]:  # one compile for every wave (masked past P and tiles, as any power of two is)
        P2, T2 = next_pow2(CONFIG["plan_pairs"]), next_pow2(tiles_bound(CONFIG["plan_pairs"], n_local, bm))
    order, ends = torch.empty(P, dtype=torch.int32, device=dev), torch.empty(n_local, dtype=torch.int32, device=dev)
    expert, row = torch.empty(tiles, dtype=torch.int32, device=dev), torch.empty(tiles, dtype=torch.int32, device=dev)
    scratch = torch.empty(P2 + 3 * N2, dtype=torch.int32, device=dev)
    launcher(_plan_kernel, ids)[(1,)](ids.contiguous(), order, ends, expert, row, scratch, P, first, n_local, tiles,
                                      P2=P2, N2=N2, T2=T2, BM=bm, LOG_P=P2.bit_length() - 1,
                                      LOG_N=N2.bit_length() - 1, **({} if interpreting() else {"num_warps": 4}))
    return order, ends, expert, row


def tile_order(block_m: int) -> str:
    """CONFIG order for tiles of block_m rows ("auto": planes_one for 16 rows, planes past them; the same bits)."""
    order = CONFIG["order"]
    if order == "auto":
        return "planes_one" if block_m == 16 else "planes"
    if order not in ORDERS:
        raise ValueError(f"DSV4_MOE_TC_ORDER={order!r}: allowed {['auto', *ORDERS]}")
    return order


def _experts(a, order, stacks: tuple[QWeight, QWeight], wt, out, plan_, limit: float, topk: int, swiglu: bool,
             tiles: tuple[int, int]):
    w1, w3 = stacks
    _, ends, expert, row = plan_
    c = CONFIG
    block_m, block_n = tiles
    order_name = tile_order(block_m)
    d1, s1 = w1.data.view(torch.int32), _scale(w1)
    d3, s3 = w3.data.view(torch.int32), _scale(w3)
    N, K = w1.shape
    options = {} if interpreting() else {"num_warps": c["num_warps"]}
    ieee, e8m0 = a.dtype == torch.float32 or interpreting(), s1.dtype == torch.uint8
    launcher(_experts_kernel, a)[(expert.shape[0], cdiv(N, block_n))](
        a, order, d1, s1, d3, s3, wt, out, expert, row, ends, N, w1.data.shape[0], d1.stride(0), s1.stride(0),
        float(limit), K=K, S_STRIDE=s1.shape[-1], E8M0=e8m0, TOPK=topk, SWIGLU=swiglu, IEEE=ieee, BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_K=min(c["block_k"], next_pow2(K)), NUM_STAGES=c["num_stages"],
        ORDER=ORDERS.index(order_name), BF16=c["bf16_decode"] and e8m0 and a.dtype == torch.bfloat16 and not ieee,
        **options)
    return out


def routed(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, stacks: list[QWeight], first: int,
           limit: float, add: torch.Tensor | None = None, out: torch.Tensor | None = None,
           tiles: tuple[int, int] | None = None) -> torch.Tensor:
    """dsv4.kernels.moe.routed's result (x [T, D], ids [T, k] global, weights [T, k] in x's dtype, FP4 stacks of
    experts first..first+n-1, add [T, D] or None, out: where the result is written) on the tensor cores. tiles:
    (block_m, block_n), CONFIG's by default (a long chunk's: long_tiles)."""
    T, k = ids.shape
    w1, w3, w2 = stacks
    tiles = tiles or (CONFIG["block_m"], CONFIG["block_n"])
    ids = ids.contiguous()
    p = plan(ids, first, w1.data.shape[0], tiles[0])
    order = p[0]
    h = torch.empty(T * k, w1.shape[0], dtype=x.dtype, device=x.device)
    _experts(x, order, (w1, w3), order, h, p, limit, k, True, tiles)
    D = w2.shape[0]
    terms = torch.empty(T * k, D, dtype=torch.float32, device=x.device)
    _experts(h, order, (w2, w2), weights.contiguous(), terms, p, limit, 1, False, tiles)
    y = _destination(out, T, D, x.dtype, x.device)
    launcher(_sum_kernel, x)[(cdiv(D, 1024), T)](terms, ids, add.contiguous() if add is not None else y, y, D, first,
                                                w1.data.shape[0], TOPK=k, ADD=add is not None, BLOCK=1024)
    return y
