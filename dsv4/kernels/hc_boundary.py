"""One mHC boundary of a decode step in one launch (reference: dsv4.model.hc's hc_post, then hc_pre, then
dsv4.model.norm.rms_norm with the next sublayer's norm weight).

Between two sublayers a decode row ran four to six launches: hc_post (new streams), an fp32 copy of them,
the mix GEMV (dense.py, 24 outputs over hc * D), hc.py's pre kernel and the RMSNorm. Here program
(row, slice) computes its D-slice of the new streams exactly as kernels/hc_post.py does, stores it, and
stores fp32 partials over its slice: the 24 dot products of the mix and the sum of squares of the
flattened streams. The last program of the row to finish (a ticket, as qgemv's split sum: no float
atomics; it puts the ticket back to 0) sums the partials over the slices in one fixed order, computes
pre / post / comb as hc.py does, collapses the new streams (read back from L2) and normalises the
collapsed row as kernels/norm.py does. The slices depend on (hc, D) alone, never on the rows, so a row
gets the same bits alone or in a batch.

The finish is latency: one program, serial phases. Two options shorten it (CONFIG; each may change the bits; both on
by default since session 9, call 4: flash decode 115.8 -> 119.1 tok/s with both): one_pass_finish holds the row's streams in registers, loaded before the maps so that their
round trip overlaps the maps, and collapses and norms them in one pass (no store and reload of the collapsed row);
warp_maps sums the partials into [hc, hc]-shaped tiles that the compiler keeps inside one warp, so that Sinkhorn's
40 row and column sums are warp shuffles (sm_90 SASS of Flash's boundary: 105 barriers, 78 of them in the finish;
with warp_maps 38 and 11).

The first boundary of a step (embedding -> layer 0) has no sublayer output: FIRST makes every stream a
copy of the embedded row. The head's collapse (hc_head, after the commit) keeps its own launches.

With a door (dsv4.parallel.Door: the all-reduce door after the next sublayer, opened by the forward when
dsv4.kernels.door CONFIG["in_place"] is on) program (0, 0) also does that door's bookkeeping, the door pack
kernel's (dsv4.kernels.door), so the door needs no launch of its own: the door's refusal flag stored after
its payload, its census cell + 1, and the previous door's reduced flag (the sublayer output this boundary
consumes carried it) added into the step's verdict. It touches nothing the boundary computes.

Every program first loads what no step writes: its slice of hc_fn (the boundary's bytes: 1.5 MB at Flash's
shapes, 48 KB a program), base, scale and, with one_pass_finish, the norm weight. Only then does it read what the
step produced. With DSV4_PDL the kernel is launched with launch_pdl and waits between the two (pdl_wait): the
slice's DRAM round trip runs while the kernel before it finishes, where it sat on the critical path after it
(session 10's graph profile of flash: ~15 us a boundary, 86 a token). The arithmetic is the same either way.
"""

import os

import torch

from . import cdiv, device_function, interpreting, launcher, next_pow2, pdl_wait
from . import qgemv

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # session 6, call 1: its CUDA tests, test_replay_gpu under triton, hc_boundary_bench

# D per slice program (the mix's fp32 weight tile is next_pow2(25) x hc x block_d), warps per program, and
# the reducer's chunk of D. benchmarks/hc_boundary_bench.py sweeps them (session 6 on an H200, a Flash mid
# boundary at 1 row: 32/4/1024 12.97 us, 128/8/2048 11.33 us, the six unfused launches 16.8 us).
# one_pass_finish (DSV4_BOUNDARY_ONE_PASS=0 turns it off, read at import): where the row fits (one_pass), the collapse and its norm
# in one pass over the row held in registers (_collapse_in_registers). warp_maps (DSV4_BOUNDARY_WARP_MAPS=0 turns it off): the
# maps' [hc, hc] tiles inside one warp (_partials_in_warp). Both off until a GPU run: each may change the bits.
CONFIG = {"block_d": 128, "num_warps": 8, "block_r": 2048,
          "one_pass_finish": os.environ.get("DSV4_BOUNDARY_ONE_PASS", "1") == "1",
          "warp_maps": os.environ.get("DSV4_BOUNDARY_WARP_MAPS", "1") == "1",
          "sinkhorn_rcp": os.environ.get("DSV4_BOUNDARY_RCP", "0") == "1"}
# sinkhorn_rcp (DSV4_BOUNDARY_RCP=1; off until a GPU run: written in session 45, never run): the finish's softmax and
# Sinkhorn divide by a row's or column's sum as c * rcp.approx.ftz(sum) (_over) where Triton's c / sum is div.full,
# whose SASS is the same MUFU.RCP and multiply behind two range checks and their predicated scalings on the serial
# chain (sm_90: FSETP, FSETP, @P FMUL before each of the 40 reciprocals). Sinkhorn costs ~2 us of a Flash boundary's
# ~7 (session 45 call 1: 0.107 us an iteration), all of it in the finishing program, on the step's critical path;
# the checks are ~10 of an iteration's ~160 cycles a half. The sums are positive and at least eps (normal), so the
# bits should be div.full's: the gate's stream says.
# Session 38 call 3 (benchmarks/RESULTS.md) measured Sinkhorn on comb's 16 values as scalars in every thread (no
# shuffle, no barrier; commit 0c87aaa): a mid boundary 6.71 -> 8.69 us, mini's pipelined decode -6.9 %: each
# thread's 640 divisions, in all 8 warps, cost more than warp_maps' 80 shuffles. Removed.
ONE_PASS_VALUES = 64  # the streams' fp32 values a thread may hold in one_pass (hc 4, D 4096, 8 warps: 64)


def supported(h: torch.Tensor, hc: int, fn: torch.Tensor, norm_w: torch.Tensor) -> bool:
    """h [T, hc, D] (the streams, or the embedded rows [T, D] of the first boundary), hc_fn [(2 + hc) * hc,
    hc * D], the next sublayer's norm weight [D] in h's dtype or fp32 (as dsv4.kernels.norm)."""
    D = h.shape[-1]
    return (h.is_contiguous() and hc == next_pow2(hc) and (h.dim() == 2 or h.shape[-2] == hc)
            and 0 < h.numel() // D <= qgemv.TICKETS and fn.shape == ((2 + hc) * hc, hc * D) and fn.is_contiguous()
            and fn.dtype == torch.float32 and norm_w.shape == (D,)
            and (norm_w.dtype in (h.dtype, torch.float32) or h.dtype == torch.float32))


def slicing(hc: int, D: int) -> tuple[int, int]:
    """(BLOCK_D, slices) from the shape alone: a row's partials are summed in one order whatever the batch."""
    block = min(CONFIG["block_d"], next_pow2(D))
    return block, cdiv(D, block)


def one_pass(hc: int, D: int) -> bool:
    """Whether the finish collapses and norms the row in one pass (CONFIG one_pass_finish, the row small enough)."""
    return CONFIG["one_pass_finish"] and hc * next_pow2(D) <= ONE_PASS_VALUES * 32 * CONFIG["num_warps"]


def _boundary_kernel(out_ptr, post_ptr, comb_ptr, h_ptr, fn_ptr, base_ptr, scale_ptr, norm_w_ptr,
                     new_ptr, post_out_ptr, comb_out_ptr, x_ptr, p_ptr, tickets_ptr, slot_ptr, flag_ptr, census_ptr,
                     seen_ptr, verdict_ptr, ids_ptr, norm_eps, eps, D: constexpr, HC: constexpr, ITERS: constexpr,
                     FIRST: constexpr, GATHER: constexpr, BLOCK_D: constexpr, SLICES: constexpr, SP: constexpr,
                     NP: constexpr, BLOCK_R: constexpr, DOOR: constexpr, SEEN: constexpr, ONE_PASS: constexpr,
                     WARP_MAPS: constexpr, RCP: constexpr = 0):
    """Grid (rows, SLICES). Partials [rows, SLICES, NP] fp32 at p_ptr: columns 0..N-1 the mix, N the sum of squares.
    GATHER (with FIRST): out_ptr the embedding table, row t's embedded row the one of token ids_ptr[t].
    DOOR: the next door's bookkeeping (slot_ptr: its payload's flag element), SEEN: with the previous door's flag.
    Every program loads the stored weights first (its slice of hc_fn, base, scale and, with ONE_PASS, the norm
    weight: module parameters, which no step writes), then pdl_wait (DSV4_PDL, launched with launch_pdl: the
    previous kernel complete, the next released), then everything the step produces."""
    t = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    k = tl.arange(0, HC)
    d = s * BLOCK_D + tl.arange(0, BLOCK_D)
    ok = d < D
    N = (2 + HC) * HC
    n = tl.arange(0, NP)
    w = tl.load(fn_ptr + n[:, None, None] * (HC * D) + k[None, :, None] * D + d[None, None, :],
                mask=(n < N)[:, None, None] & ok[None, None, :], other=0.0)
    stored = _stored_maps(base_ptr, scale_ptr, HC)
    if ONE_PASS:  # the finish collapses the row in registers: its norm weight whole
        r = tl.arange(0, BLOCK_R)
        norm_w = tl.load(norm_w_ptr + r, mask=r < D, other=0.0)
    else:  # the finish's _collapse reads it in chunks
        norm_w = norm_w_ptr
    pdl_wait()
    if DOOR:
        if (t == 0) & (s == 0):
            tl.store(slot_ptr, tl.load(flag_ptr).to(slot_ptr.dtype.element_ty))
            tl.store(census_ptr, tl.load(census_ptr) + 1)
            if SEEN:
                tl.store(verdict_ptr, tl.load(verdict_ptr) + tl.load(seen_ptr).to(tl.float32))
    dt = new_ptr.dtype.element_ty
    row = t
    if GATHER:  # out is the embedding table: this row's token's row of it
        row = tl.load(ids_ptr + t).to(tl.int64)
    x = tl.load(out_ptr + row * D + d, mask=ok, other=0.0).to(tl.float32)
    if FIRST:
        new = tl.zeros([HC, BLOCK_D], dtype=tl.float32) + x[None, :]
    else:
        # hc_post.py's arithmetic: post and comb rounded to the streams' dtype, one rounding of the sum
        post = tl.load(post_ptr + t * HC + k).to(dt).to(tl.float32)
        comb = tl.load(comb_ptr + t * HC * HC + k[:, None] * HC + k[None, :]).to(dt).to(tl.float32)  # [j, k]
        h = tl.load(h_ptr + t * HC * D + k[:, None] * D + d[None, :], mask=ok[None, :], other=0.0).to(tl.float32)
        new = post[:, None] * x[None, :] + tl.sum(comb[:, :, None] * h[:, None, :], axis=0)
    new = new.to(dt)
    tl.store(new_ptr + t * HC * D + k[:, None] * D + d[None, :], new, mask=ok[None, :])
    new = new.to(tl.float32)

    part = tl.sum(tl.sum(w * new[None, :, :], axis=2), axis=1)
    part = tl.where(n == N, tl.sum(tl.sum(new * new, axis=1), axis=0), part)
    row_p = p_ptr + t * SLICES * NP
    if WARP_MAPS:  # comb's columns first, then pre's, post's and the sum of squares (_partials_in_warp's tiles)
        n = tl.where(n < 2 * HC, n + HC * HC, tl.where(n < N, n - 2 * HC, n))
    tl.store(row_p + s * NP + n, part)
    # As qgemv._reduce_splits: every thread's stores before the ticket's release; the last program reduces.
    tl.debug_barrier()
    if tl.atomic_add(tickets_ptr + t, 1, sem="acq_rel", scope="gpu") == SLICES - 1:
        _finish(row_p, t, stored, norm_w, new_ptr, post_out_ptr, comb_out_ptr, x_ptr, norm_eps, eps, D, HC, ITERS,
                SLICES, SP, NP, BLOCK_R, ONE_PASS, WARP_MAPS, RCP)
        tl.store(tickets_ptr + t, 0)


@device_function
def _stored_maps(base_ptr, scale_ptr, HC: constexpr):
    """The maps' stored terms: (pre's base [HC], post's [HC], comb's [HC, HC], the three scales), fp32."""
    k = tl.arange(0, HC)
    j = k[:, None] * HC + k[None, :]
    return (tl.load(base_ptr + k).to(tl.float32), tl.load(base_ptr + HC + k).to(tl.float32),
            tl.load(base_ptr + 2 * HC + j).to(tl.float32), tl.load(scale_ptr).to(tl.float32),
            tl.load(scale_ptr + 1).to(tl.float32), tl.load(scale_ptr + 2).to(tl.float32))


@device_function
def _finish(row_p, t, stored, norm_w, new_ptr, post_out_ptr, comb_out_ptr, x_ptr, norm_eps, eps, D: constexpr,
            HC: constexpr, ITERS: constexpr, SLICES: constexpr, SP: constexpr, NP: constexpr, BLOCK_R: constexpr,
            ONE_PASS: constexpr, WARP_MAPS: constexpr, RCP: constexpr = 0):
    """The row's last program: the slices' partials summed (one tree over the slices, the same every launch),
    hc.py's maps (their stored terms `stored`, _stored_maps'), then the collapse and its RMSNorm (norm_w: the
    weight's values with ONE_PASS, else its pointer). Loads of what other programs wrote go to L2 (.cg)."""
    k = tl.arange(0, HC)
    j = k[:, None] * HC + k[None, :]
    streams = new_ptr + t * HC * D + k[:, None] * D
    if ONE_PASS:  # the row's streams first: their round trip overlaps the maps' arithmetic
        r = tl.arange(0, BLOCK_R)
        hv = tl.load(streams + r[None, :], mask=(r < D)[None, :], other=0.0, cache_modifier=".cg")
    if WARP_MAPS:
        pre_w, post_w, comb_w, squares = _partials_in_warp(row_p, HC, SLICES, SP, NP)
    else:
        pre_w, post_w, comb_w, squares = _partials(row_p, HC, SLICES, SP, NP)
    pre, c = _maps(pre_w, post_w, comb_w, squares, stored, post_out_ptr + t * HC, norm_eps, eps, D, HC, ITERS, RCP)
    tl.store(comb_out_ptr + t * HC * HC + j, c)
    if ONE_PASS:
        _collapse_in_registers(pre, hv, norm_w, x_ptr + t * D, norm_eps, D, BLOCK_R)
    else:
        _collapse(pre, streams, norm_w, x_ptr + t * D, norm_eps, D, BLOCK_R)


@device_function
def _partials(row_p, HC: constexpr, SLICES: constexpr, SP: constexpr, NP: constexpr):
    """The row's partials summed over its slices: (pre_w [HC], post_w [HC], comb_w [HC, HC], the sum of squares)."""
    k = tl.arange(0, HC)
    j = k[:, None] * HC + k[None, :]
    sp = tl.arange(0, SP)
    live = sp < SLICES
    slices = row_p + sp * NP
    pre_w = tl.sum(tl.load(slices[:, None] + k[None, :], mask=live[:, None], other=0.0, cache_modifier=".cg"), axis=0)
    post_w = tl.sum(tl.load(slices[:, None] + HC + k[None, :], mask=live[:, None], other=0.0, cache_modifier=".cg"),
                    axis=0)
    comb_w = tl.sum(tl.load(slices[:, None, None] + 2 * HC + j[None, :, :], mask=live[:, None, None], other=0.0,
                            cache_modifier=".cg"), axis=0)
    squares = tl.sum(tl.load(slices + (2 + HC) * HC, mask=live, other=0.0, cache_modifier=".cg"), axis=0)
    return pre_w, post_w, comb_w, squares


@device_function
def _partials_in_warp(row_p, HC: constexpr, SLICES: constexpr, SP: constexpr, NP: constexpr):
    """_partials' sums from two [slices, HC * HC] and [slices, 4 * HC] tiles of the slices' columns (stored
    comb's first, then pre's, post's and the sum of squares), reshaped from their flat sums to [HC, HC] and
    [4, HC]: the compiler then keeps a tile's rows and columns inside one warp, so that the maps' row and column
    sums are warp shuffles. (From _partials' [slices, HC, HC] tile the sum's rows are spread over 4 warps on sm_90:
    each of Sinkhorn's column sums a round trip through shared memory between barriers.) Of the second sum
    pre_w is row 0, post_w row 1, the sum of squares element (2, 0), each picked out by a masked sum (the others
    add zeros)."""
    k = tl.arange(0, HC)
    sp = tl.arange(0, SP)
    live = (sp < SLICES)[:, None]
    tiles = row_p + sp[:, None] * NP
    e = tl.arange(0, HC * HC)
    comb_w = tl.sum(tl.load(tiles + e[None, :], mask=live, other=0.0, cache_modifier=".cg"), axis=0)
    m = tl.arange(0, 4 * HC)
    misc = tl.sum(tl.load(tiles + HC * HC + m[None, :], mask=live & (m <= 2 * HC)[None, :], other=0.0,
                          cache_modifier=".cg"), axis=0)
    misc = tl.reshape(misc, [4, HC])
    row = tl.arange(0, 4)[:, None]
    pre_w = tl.sum(tl.where(row == 0, misc, 0.0), axis=0)
    post_w = tl.sum(tl.where(row == 1, misc, 0.0), axis=0)
    squares = tl.sum(tl.sum(tl.where((row == 2) & (k[None, :] == 0), misc, 0.0), axis=1), axis=0)
    return pre_w, post_w, tl.reshape(comb_w, [HC, HC]), squares


@device_function
def _maps(pre_w, post_w, comb_w, squares, stored, post_out, norm_eps, eps, D: constexpr, HC: constexpr,
          ITERS: constexpr, RCP: constexpr = 0):
    """hc.py's maps from the un-normed mix (linear(x * r) = r * linear(x) for the row's scalar r) and the stored
    terms (_stored_maps'): post stored at post_out, (pre, comb) returned; its divisions by sums _over's."""
    pre_b, post_b, comb_b, s0, s1, s2 = stored
    rstd = tl.rsqrt(squares / (HC * D) + norm_eps)
    pre = tl.sigmoid(pre_w * rstd * s0 + pre_b) + eps
    tl.store(post_out + tl.arange(0, HC), 2 * tl.sigmoid(post_w * rstd * s1 + post_b))
    c = comb_w * rstd * s2 + comb_b
    c = tl.exp(c - tl.max(c, axis=1)[:, None])
    c = _over(c, tl.sum(c, axis=1)[:, None], RCP) + eps
    c = _over(c, tl.sum(c, axis=0)[None, :] + eps, RCP)
    for _ in tl.static_range(ITERS - 1):
        c = _over(c, tl.sum(c, axis=1)[:, None] + eps, RCP)
        c = _over(c, tl.sum(c, axis=0)[None, :] + eps, RCP)
    return pre, c


@device_function
def _over(c, s, RCP: constexpr):
    """c / s (Triton's fp32 division: div.full), or with RCP (CONFIG sinkhorn_rcp) c * rcp.approx.ftz(s), rounded:
    the MUFU.RCP and multiply div.full makes for a normal s, without its range checks (s: a sum of positive terms, at
    least eps). s broadcasts against c."""
    if RCP:  # mul.rn: the product rounded on its own, as div.full's (a plain multiply the compiler would fuse into
        # the next sum's adds: other bits)
        return tl.inline_asm_elementwise("{ .reg .f32 r; rcp.approx.ftz.f32 r, $2; mul.rn.f32 $0, $1, r; }", "=f,f,f",
                                         [c, s], dtype=tl.float32, is_pure=True, pack=1)
    return c / s


@device_function
def _collapse(pre, streams, norm_w_ptr, x_row, norm_eps, D: constexpr, BLOCK_R: constexpr):
    """The collapse, rounded to the streams' dtype, stored and read back by the norm's second pass."""
    dt = x_row.dtype.element_ty
    r = tl.arange(0, BLOCK_R)
    acc = tl.zeros([BLOCK_R], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_R):
        m = (d0 + r) < D
        hv = tl.load(streams + d0 + r[None, :], mask=m[None, :], other=0.0, cache_modifier=".cg").to(tl.float32)
        y = tl.sum(pre[:, None] * hv, axis=0).to(dt)
        tl.store(x_row + d0 + r, y, mask=m)
        y = y.to(tl.float32)
        acc += y * y
    rstd_x = tl.rsqrt(tl.sum(acc, axis=0) / D + norm_eps)
    tl.debug_barrier()
    for d0 in range(0, D, BLOCK_R):  # norm.py's weighted arithmetic
        m = (d0 + r) < D
        y = (tl.load(x_row + d0 + r, mask=m, other=0.0, cache_modifier=".cg").to(tl.float32) * rstd_x).to(dt)
        y = (tl.load(norm_w_ptr + d0 + r, mask=m, other=0.0).to(tl.float32) * y.to(tl.float32)).to(dt)
        tl.store(x_row + d0 + r, y, mask=m)


@device_function
def _collapse_in_registers(pre, hv, norm_w, x_row, norm_eps, D: constexpr, BLOCK_R: constexpr):
    """_collapse's arithmetic on the row held in registers (BLOCK_R >= D): stored once, the sum of squares one
    tl.sum over the row (_collapse's adds per-chunk columns first: the bits may differ from its)."""
    dt = x_row.dtype.element_ty
    r = tl.arange(0, BLOCK_R)
    y = tl.sum(pre[:, None] * hv.to(tl.float32), axis=0).to(dt).to(tl.float32)
    rstd_x = tl.rsqrt(tl.sum(y * y, axis=0) / D + norm_eps)
    y = (y * rstd_x).to(dt)  # norm.py's weighted arithmetic
    tl.store(x_row + r, (norm_w.to(tl.float32) * y.to(tl.float32)).to(dt), mask=r < D)


def boundary(out, post, comb, h, fn, base, scale, norm_w, hc: int, iters: int, norm_eps: float, eps: float,
             door=None, ids=None):
    """The sublayer's reduced output out [T, D] placed into the streams h [T, hc, D] by post [T, hc] and
    comb [T, hc, hc] (h None: the first boundary, out the embedded rows), then the next sublayer's maps
    from hc_fn/base/scale and its input normed by norm_w -> (streams [T, hc, D], post [T, hc] fp32,
    comb [T, hc, hc] fp32, normed [T, D] in the streams' dtype). door (a dsv4.parallel.Door, or None): its
    bookkeeping done in the same launch. ids [T] (the first boundary only): out is then the embedding table
    [vocab, D] and each program reads its row's embedded row from it (the gather's launch saved; the same
    values as out.index_select(0, ids)). hc_fn, base, scale and norm_w are the model's stored weights, contiguous:
    the kernel reads them in place before it waits for the kernel before it (DSV4_PDL), so never a copy this step
    writes."""
    if not all(w.is_contiguous() for w in (fn, base, scale, norm_w)):
        raise ValueError("hc_boundary.boundary: the stored weights must be contiguous (read in place before the wait)")
    if ids is not None and h is not None:
        raise ValueError("hc_boundary.boundary: ids (the embedding's gather) is for the first boundary only")
    T, D = (ids.numel(), out.shape[1]) if ids is not None else out.shape
    first = h is None
    out = out.contiguous()
    dtype = out.dtype if first else h.dtype  # the streams', as hc_post's
    new = torch.empty(T, hc, D, dtype=dtype, device=out.device)
    post_out = torch.empty(T, hc, dtype=torch.float32, device=out.device)
    comb_out = torch.empty(T, hc, hc, dtype=torch.float32, device=out.device)
    x = torch.empty(T, D, dtype=dtype, device=out.device)
    block_d, slices = slicing(hc, D)
    np_ = next_pow2((2 + hc) * hc + 1)
    partials = torch.empty(T, slices, np_, dtype=torch.float32, device=out.device)
    tickets = qgemv.tickets_for(T, out.device)
    if tickets is None:  # a capture before any eager launch made the device's tickets: a zeroed buffer of its own
        tickets = torch.zeros(T, dtype=torch.int32, device=out.device)
    extra = {} if interpreting() else {"num_warps": CONFIG["num_warps"]}
    single = one_pass(hc, D)
    block_r = next_pow2(D) if single else min(CONFIG["block_r"], next_pow2(D))
    if door is None:
        bookkeeping = (out,) * 5
    else:
        bookkeeping = (door.payload[door.n:], door.flag, door.census, door.flag if door.seen is None else door.seen,
                       door.verdict)
    launcher(_boundary_kernel, out)[(T, slices)](
        out, out if first else post.contiguous(), out if first else comb.contiguous(), out if first else h,
        fn, base, scale, norm_w, new, post_out, comb_out, x, partials, tickets,
        *bookkeeping, out if ids is None else ids, float(norm_eps), float(eps), D=D, HC=hc, ITERS=iters,
        FIRST=first, GATHER=ids is not None, BLOCK_D=block_d,
        SLICES=slices, SP=next_pow2(slices), NP=np_, BLOCK_R=block_r,
        DOOR=door is not None, SEEN=door is not None and door.seen is not None, ONE_PASS=single,
        WARP_MAPS=CONFIG["warp_maps"], **({"RCP": 1} if CONFIG["sinkhorn_rcp"] and not interpreting() else {}),
        **extra)
    return new, post_out, comb_out, x
