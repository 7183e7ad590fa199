"""Decode attention of one layer in two kernels (reference: dsv4.model.attention._attend).

All heads share one K=V row per key (MQA), so a program loads a tile of key rows once and scores
every head of its block against it (one [heads, hd] x [hd, keys] product), then adds p * v from the
same tile. The keys a layer sees form one index space, read in place by index:

    [ring W | chunk T]            the sliding window, masked by `visible` [T, W + T]
    CSA: [K picks]                pick i is row sel[t, i] of [comp | new], masked by `valid` [T, K]
    HCA: [comp rows | new rows]   masked by `committed` [Ns] and `new_visible` [T, n_win]

Flash-decoding: the index space is cut into SPLITS contiguous ranges, one program each (per query
and head block), each leaving an online-softmax partial (max, sum, unnormalised output) in fp32.
The second kernel combines a head's partials in split order (deterministic, no atomics) with the
head's sink logit, which joins the denominator only, and rotates the output's rope slice back at
the query position. Logits and sums are fp32; p is rounded to the keys' dtype for the p * v
product, as flash attention does; the output is rounded once, to q's dtype.

Fused combine (CONFIG fused_combine, DSV4_ATTN_FUSED_COMBINE=1 at import; off until a GPU run): one launch.
Each split program stores its partial, then takes a ticket of its (query, head block) as qgemv._reduce_splits
does (an int32 counter, acq_rel; no float atomics); the last program merges the block's partials (_merge: the
combine's arithmetic for all its heads at once, the partials read from L2) and puts the ticket back to 0. The
merge is one program's work, SPLITS * BLOCK_H * HD * 4 bytes read by one SM, so launches of more than
CONFIG fused_max_splits splits keep the two kernels. The merge adds the splits' outputs in split order,
elementwise; the combine kernel's tl.sum over them (and both kernels' sums of the denominators) associate
as their tile layouts do: on a GPU the bits may differ from the two launches' (within float rounding; the
interpreter sums in split order both ways, equal bits).

Pooled (POOLED, `ids`; dispatched by dsv4.kernels.pooled): the queries are B rows of one token each,
row b's caches the slot ids[b] of stacked pool caches (win [slots, W, hd], comp [slots, NS, hd]), its
chunk kv[b], its new rows new[b] and its masks row b of each. A row's program does exactly the
arithmetic of the same row launched alone (the same splits: they depend on shapes only).

Verify (VERIFY, `verify`: the rows' positions; dsv4.model.attention._in_chunk, layout CONFIG verify_chunk): the
queries are the R rows of one sequence's verify step, row t the decode step at pos0 + t once rows 0..t-1 are
committed, but nothing of the step is in the caches yet. Row t's program is that decode step's (T = 1 shapes, its
own masks), with two kinds of loads pointed elsewhere: a ring slot that row t' < t wrote ((slot - pos0) mod W = t')
reads kv[t'], and (HCA) a store row of a window this step closed reads the chunk's entry of that window. The same
keys in the same places of the index space: the same bits as the decode step's launch.
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

GPU_CHECKED = True  # through benchmarks/gpu_checks.sh (session 3): "auto" runs it on CUDA
MAX_T = 8  # queries per call: decode and small chunks; prefill keeps the reference
# block_n keys per tile, tiles per split (program), block_h heads per program; benchmarks/attention_bench.py
# times variants. 64 keys and 16 heads a program in session 41 (call 3, decode_ab on mini: pipelined +0.65 %,
# ahead in every round, where 64 keys with 32 heads lost 1.0 %; session 20's attention_bench at a Flash rank's 32
# heads: sliding 10.5 -> 9.5 us, CSA 14.1 -> 12.3): half the splits, so half the partials written and combined, and
# twice the programs a split. Session 42, with the combine a program per chunk of columns: 32 keys (call 4: pipelined
# +0.66 % against 64, ahead in every round; other bits), then 16 (call 5: +0.6 % against 32, ahead in every round;
# other bits; 8 heads a program lost 4 %).
# combine_split_d (DSV4_ATTN_COMBINE_SPLIT_D=0 turns it off; on since session 42): the combine's program of a head cut
# into one a BLOCK_D chunk of the unrotated columns plus one for the rope's (mini: 64 -> 320 programs a token), each
# with the whole row's arithmetic on its columns (the same bits): a head's chunks were a serial loop of L2 round
# trips. Session 42 call 4 (decode_ab on mini, 6 rounds): pipelined +1.2 %, ahead in rounds 1-5, the same stream.
CONFIG = {"block_n": 16, "tiles": 1, "block_h": 16, "num_warps": 8, "combine_warps": 4,
          "fused_combine": os.environ.get("DSV4_ATTN_FUSED_COMBINE", "0") == "1", "fused_max_splits": 8,
          "combine_split_d": os.environ.get("DSV4_ATTN_COMBINE_SPLIT_D", "1") == "1"}
MERGE_VALUES = 64  # fp32 values of the partials a thread of the merging program holds per chunk
_NO_MAX = constexpr(-1.0e30)  # a finite "no key yet" running max: exp(_NO_MAX - _NO_MAX) = 1, never NaN


def _attn_split_kernel(q_ptr, win_ptr, kv_ptr, vis_ptr, comp_ptr, new_ptr, sel_ptr, ok_ptr, ok_new_ptr,
                       m_ptr, l_ptr, acc_ptr, ids_ptr, sink_ptr, cos_ptr, sin_ptr, out_ptr, tickets_ptr, NS, NW,
                       sel_stride, ok_stride, scale, T: constexpr, H: constexpr, HD: constexpr, W: constexpr,
                       K: constexpr, PICKS: constexpr, ALL_ROWS: constexpr, SPLITS: constexpr, TILES: constexpr,
                       BLOCK_H: constexpr, BLOCK_N: constexpr, USE_DOT: constexpr, DOT_F32: constexpr,
                       POOLED: constexpr, FUSED: constexpr, NOPE: constexpr, HALF: constexpr, SP: constexpr,
                       MERGE_D: constexpr, VERIFY: constexpr = 0, RATE: constexpr = 1):
    """FUSED: the last program of a (query, head block) merges its partials into out (see the module's doc).
    VERIFY: a verify step's rows (see the module's doc), RATE its layer's compress rate (HCA's store rows)."""
    pdl_wait()
    s = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    t = tl.program_id(2).to(tl.int64)
    if POOLED:  # t is a row (T == 1): its slot's caches, its own chunk row, new rows and committed mask
        slot = tl.load(ids_ptr + t)
        win_ptr += slot * (W * HD)
        comp_ptr += slot * NS * HD
        kv_ptr += t * HD
        new_ptr += t * NW * HD
        if ALL_ROWS:
            ok_ptr += t * NS
    if VERIFY:  # t is row t of a verify step at pos0 + t (T == 1): this step's rows t' < t wrote are its chunk's
        pos0 = tl.load(ids_ptr)
        slot0 = pos0 % W
        chunk_ptr = kv_ptr
        kv_ptr += t * HD
        if ALL_ROWS:  # its committed mask; its own window's entry (NW == 1) among the chunk's windows from wid0
            ok_ptr += t * NS
            wid0 = pos0 // RATE
            windows_ptr = new_ptr
            new_ptr += ((pos0 + t) // RATE - wid0) * HD
    h_ok = h < H
    d = tl.arange(0, HD)
    q = tl.load(q_ptr + (t * H + h[:, None]) * HD + d[None, :], mask=h_ok[:, None], other=0.0)
    dt = q.dtype
    if DOT_F32:  # Triton 3.6's interpreter multiplies 16-bit dot operands as raw bits: widen them (exactly)
        q = q.to(tl.float32)
    S0 = W + T
    m = tl.full([BLOCK_H], _NO_MAX, dtype=tl.float32)
    l = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, HD], dtype=tl.float32)
    for i in range(TILES):
        j = (s * TILES + i) * BLOCK_N + tl.arange(0, BLOCK_N)
        in0 = j < S0
        ok = tl.load(vis_ptr + t * S0 + j, mask=in0, other=0) != 0
        row = tl.where(j < W, win_ptr + j * HD, kv_ptr + (j - W) * HD)
        if VERIFY:  # ring slot j holds row `back`'s key once rows 0..t-1 are committed
            back = (j - slot0 + W) % W
            row = tl.where((j < W) & (back < t), chunk_ptr + back * HD, row)
        j1 = j - S0
        if PICKS:  # CSA
            in1 = (j1 >= 0) & (j1 < K)
            idx = tl.load(sel_ptr + t * sel_stride + j1, mask=in1, other=0)
            row = tl.where(in1, tl.where(idx < NS, comp_ptr + idx * HD, new_ptr + (idx - NS) * HD), row)
            ok = tl.where(in1, tl.load(ok_ptr + t * ok_stride + j1, mask=in1, other=0) != 0, ok)
        if ALL_ROWS:  # HCA
            in1 = (j1 >= 0) & (j1 < NS)
            j2 = j1 - NS
            in2 = (j2 >= 0) & (j2 < NW)
            row = tl.where(in1, comp_ptr + j1 * HD, tl.where(in2, new_ptr + j2 * HD, row))
            if VERIFY:  # store rows from wid0 on: windows this step closed, in its chunk's entries
                row = tl.where(in1 & (j1 >= wid0), windows_ptr + (j1 - wid0) * HD, row)
            ok = tl.where(in1, tl.load(ok_ptr + j1, mask=in1, other=0) != 0, ok)
            ok = tl.where(in2, tl.load(ok_new_ptr + t * NW + j2, mask=in2, other=0) != 0, ok)
        kt = tl.load(row[:, None] + d[None, :], mask=ok[:, None], other=0.0)  # [BLOCK_N, HD], K = V
        if DOT_F32:
            kt = kt.to(tl.float32)
        if USE_DOT:
            sc = tl.dot(q, tl.trans(kt), input_precision="ieee")
        else:  # too few heads for a tensor-core tile
            sc = tl.sum(q[:, None, :].to(tl.float32) * kt[None, :, :].to(tl.float32), axis=2)
        sc = tl.where(ok[None, :], sc * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(sc, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(sc - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        if USE_DOT:
            pv = tl.dot(p.to(dt).to(kt.dtype), kt, input_precision="ieee")
        else:
            pv = tl.sum(p[:, :, None] * kt[None, :, :].to(tl.float32), axis=1)
        acc = acc * alpha[:, None] + pv
        m = m_new
    part = (t * H + h) * SPLITS + s
    tl.store(m_ptr + part, m, mask=h_ok)
    tl.store(l_ptr + part, l, mask=h_ok)
    tl.store(acc_ptr + part[:, None] * HD + d[None, :], acc, mask=h_ok[:, None])
    if FUSED:  # as qgemv._reduce_splits: every thread's stores before the ticket's release
        tl.debug_barrier()
        ticket = tickets_ptr + t * tl.num_programs(1) + tl.program_id(1)
        if tl.atomic_add(ticket, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:
            _merge(m_ptr, l_ptr, acc_ptr, sink_ptr, cos_ptr, sin_ptr, out_ptr, t, h, h_ok, H, HD, NOPE, HALF, SPLITS,
                   SP, MERGE_D)
            tl.store(ticket, 0)


@device_function
def _merge(m_ptr, l_ptr, acc_ptr, sink_ptr, cos_ptr, sin_ptr, out_ptr, t, h, h_ok, H: constexpr, HD: constexpr,
           NOPE: constexpr, HALF: constexpr, SPLITS: constexpr, SP: constexpr, MERGE_D: constexpr):
    """_attn_combine_kernel's arithmetic for the heads h of query t at once, in chunks of MERGE_D columns (the
    rope's columns the last chunks, split into even and odd after the sum), the partials read from L2 (.cg:
    other programs wrote them). Each split's [heads, MERGE_D] tile is added in split order, elementwise: the sums
    over the splits stay in each thread's registers (a [heads, splits, MERGE_D] tile's sum spreads the splits over
    warps on sm_90: a shared-memory round trip per chunk). The next chunk's loads are issued before this chunk's
    store: the compiler would not move them above it (it cannot tell the output from the partials)."""
    r = t * H + h
    row = r * SPLITS
    sp = tl.arange(0, SP)
    ok = h_ok[:, None] & (sp < SPLITS)[None, :]
    ms = tl.load(m_ptr + row[:, None] + sp[None, :], mask=ok, other=_NO_MAX, cache_modifier=".cg")
    ls = tl.load(l_ptr + row[:, None] + sp[None, :], mask=ok, other=0.0, cache_modifier=".cg")
    dt = out_ptr.dtype.element_ty
    sink = tl.load(sink_ptr + h, mask=h_ok, other=0.0).to(dt).to(tl.float32)  # the reference adds it in q's dtype
    mx = tl.maximum(tl.max(ms, axis=1), sink)
    den = tl.sum(tl.exp(ms - mx[:, None]) * ls, axis=1) + tl.exp(sink - mx)
    ws = ()  # each split's weights [heads, 1]
    for s in tl.static_range(SPLITS):
        m_s = tl.load(m_ptr + row + s, mask=h_ok, other=_NO_MAX, cache_modifier=".cg")
        ws = ws + ((tl.exp(m_s - mx) / den)[:, None],)
    dd = tl.arange(0, MERGE_D)
    parts = acc_ptr + row[:, None] * HD + dd[None, :]
    live = h_ok[:, None]
    out = out_ptr + r[:, None] * HD + dd[None, :]
    k = tl.arange(0, MERGE_D // 2)
    rotations = ()  # the rope chunks' cos and sin, loaded before the chunks' stores (as the chunks' loads)
    for k0 in tl.static_range(0, HALF, MERGE_D // 2):
        rotations = rotations + ((tl.load(cos_ptr + t * HALF + k0 + k)[None, :],
                                  tl.load(sin_ptr + t * HALF + k0 + k)[None, :]),)
    ahead = _chunk(parts, live, 0, HD, SPLITS)
    for d0 in tl.static_range(0, HD, MERGE_D):
        tiles = ahead
        if d0 + MERGE_D < HD:
            ahead = _chunk(parts, live, d0 + MERGE_D, HD, SPLITS)
        o = ws[0] * tiles[0]
        for s in tl.static_range(1, SPLITS):
            o += ws[s] * tiles[s]
        if d0 < NOPE:
            tl.store(out + d0, o.to(dt), mask=live)
        else:  # rotated back by -sin at the query's position
            even, odd = tl.split(tl.reshape(o, [h.shape[0], MERGE_D // 2, 2]))
            c, sn = rotations[(d0 - NOPE) // MERGE_D]
            o = tl.reshape(tl.join(even * c + odd * sn, odd * c - even * sn), [h.shape[0], MERGE_D])
            tl.store(out + d0, o.to(dt), mask=live)


@device_function
def _chunk(parts, live, d0, HD: constexpr, SPLITS: constexpr):
    """The splits' partials of columns d0 + [0, MERGE_D) of the heads' rows at parts: a tuple of tiles."""
    tiles = ()
    for s in tl.static_range(SPLITS):
        tiles = tiles + (tl.load(parts + s * HD + d0, mask=live, other=0.0, cache_modifier=".cg"),)
    return tiles


def _attn_combine_kernel(m_ptr, l_ptr, acc_ptr, sink_ptr, cos_ptr, sin_ptr, out_ptr, H: constexpr, HD: constexpr,
                         NOPE: constexpr, HALF: constexpr, SPLITS: constexpr, BLOCK_S: constexpr, BLOCK_D: constexpr,
                         SPLIT_D: constexpr):
    """Grid (H, T), or with SPLIT_D (H, cdiv(NOPE, BLOCK_D) + 1, T): program (h, c, t) combines one BLOCK_D chunk of
    the unrotated columns, the last c the rope's columns, each with the arithmetic of the whole row's program (the
    same tiles, the same sums)."""
    pdl_wait()
    h = tl.program_id(0)
    t = tl.program_id(2 if SPLIT_D else 1).to(tl.int64)
    r = t * H + h
    sp = tl.arange(0, BLOCK_S)
    s_ok = sp < SPLITS
    ms = tl.load(m_ptr + r * SPLITS + sp, mask=s_ok, other=_NO_MAX)
    ls = tl.load(l_ptr + r * SPLITS + sp, mask=s_ok, other=0.0)
    dt = out_ptr.dtype.element_ty
    sink = tl.load(sink_ptr + h).to(dt).to(tl.float32)  # the reference adds the sink in q's dtype
    mx = tl.maximum(tl.max(ms, axis=0), sink)
    wt = tl.exp(ms - mx)
    wt = wt / (tl.sum(wt * ls, axis=0) + tl.exp(sink - mx))
    parts = acc_ptr + (r * SPLITS + sp[:, None]) * HD
    out = out_ptr + r * HD
    if SPLIT_D:
        c = tl.program_id(1)
        if c * BLOCK_D < NOPE:
            _combine_chunk(parts, out, wt, s_ok, c * BLOCK_D, NOPE, BLOCK_D)
        else:
            _combine_rope(parts, out, wt, s_ok, cos_ptr, sin_ptr, t, NOPE, HALF)
    else:
        for d0 in range(0, NOPE, BLOCK_D):
            _combine_chunk(parts, out, wt, s_ok, d0, NOPE, BLOCK_D)
        _combine_rope(parts, out, wt, s_ok, cos_ptr, sin_ptr, t, NOPE, HALF)


@device_function
def _combine_chunk(parts, out, wt, s_ok, d0, NOPE: constexpr, BLOCK_D: constexpr):
    """Columns d0 + [0, BLOCK_D) of the unrotated part: the splits' partials weighted and summed."""
    dd = tl.arange(0, BLOCK_D)
    dm = (d0 + dd) < NOPE
    a = tl.load(parts + d0 + dd[None, :], mask=s_ok[:, None] & dm[None, :], other=0.0)
    tl.store(out + d0 + dd, tl.sum(wt[:, None] * a, axis=0).to(out.dtype.element_ty), mask=dm)


@device_function
def _combine_rope(parts, out, wt, s_ok, cos_ptr, sin_ptr, t, NOPE: constexpr, HALF: constexpr):
    """The rope's columns: summed as even and odd, rotated back by -sin at the query's position."""
    dt = out.dtype.element_ty
    k = tl.arange(0, HALF)
    even = tl.sum(wt[:, None] * tl.load(parts + NOPE + 2 * k[None, :], mask=s_ok[:, None], other=0.0), axis=0)
    odd = tl.sum(wt[:, None] * tl.load(parts + NOPE + 2 * k[None, :] + 1, mask=s_ok[:, None], other=0.0), axis=0)
    c = tl.load(cos_ptr + t * HALF + k)
    sn = tl.load(sin_ptr + t * HALF + k)
    tl.store(out + NOPE + 2 * k, (even * c + odd * sn).to(dt))  # rotated by -sin: the inverse
    tl.store(out + NOPE + 2 * k + 1, (odd * c - even * sn).to(dt))


def supported(q, win, kv, visible, sink, cos, sin, comp=None, new=None, sel=None, valid=None, committed=None,
              new_visible=None, ids=None, verify=None, rate: int = 0) -> bool:
    T, H, hd = q.shape
    half = cos.shape[-1]
    rows = [x for x in (q, win, kv, comp, new) if x is not None]
    masks = [x for x in (visible, committed, new_visible) if x is not None]
    picks = [x for x in (sel, valid) if x is not None]
    if verify is not None:  # T rows of one sequence, each with a decode step's masks
        W = win.shape[-2]
        hca = comp is not None and sel is None
        shapes = (ids is None and 1 <= T <= MAX_T and win.dim() == 2 and verify.dtype == torch.int64
                  and verify.shape == (T,) and visible.shape == (T, W + 1) and kv.shape[0] == T
                  and (not hca or (rate > 0 and committed.shape == (T, comp.shape[0])
                                   and new_visible.shape == (T, 1))))
    elif ids is None:
        shapes = 1 <= T <= MAX_T
    else:  # pooled: T rows of one token each, any number of them
        shapes = (ids.dtype == torch.int64 and ids.shape == (T,) and ids.is_contiguous() and win.dim() == 3
                  and (comp is None or (comp.dim() == 3 and new.dim() == 3)))
    return (shapes and hd == next_pow2(hd) and half == next_pow2(half) and 2 * half <= hd
            and q.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and all(x.is_contiguous() and x.dtype == q.dtype and x.shape[-1] == hd for x in rows)
            and all(x.is_contiguous() and x.dtype == torch.bool for x in masks)
            and all(x.stride(-1) == 1 for x in picks)
            and all(x.is_contiguous() and x.dtype == torch.float32 for x in (cos, sin))
            and sink.is_contiguous() and sink.numel() == H)


def attention(q, win, kv, visible, sink, cos, sin, comp=None, new=None, sel=None, valid=None, committed=None,
              new_visible=None, ids=None, verify=None, rate: int = 0) -> torch.Tensor:
    """q [T, H, hd] against the window [win; kv] masked by visible [T, W + T], plus CSA's picks
    (comp, new, sel, valid) or HCA's rows (comp, new, committed, new_visible); -> [T, H, hd] in q's dtype.
    Pooled (ids [B], T = B rows of one token): win [slots, W, hd], kv [B, hd], visible [B, W + 1],
    comp [slots, NS, hd], new [B, n_win, hd], committed [B, NS], other masks [B, ...].
    Verify (verify: the positions [T] of a verify step's rows, pos0 + t, of one sequence): row t is the decode step
    at pos0 + t once rows 0..t-1 are committed, its caches as they were before the step (win [W, hd], comp), its
    keys the decode step's: visible [T, W + 1] (each row's), kv [T, hd] the rows' keys, the keys rows t' < t left in
    the ring read from kv; CSA: sel, valid [T, K] over [comp | new], new the entries of the windows the rows touch
    (the rows as one chunk: model.compressor.index_topk), K the decode step's; HCA: committed [T, NS] and
    new_visible [T, 1] each row's, new [n_win, hd] the windows the rows touch from wid0 = pos0 // rate, the store rows
    from wid0 on (windows this step closed) read from it. Each row's program is the decode step's, its loads
    pointed elsewhere: the same splits, the same arithmetic, the same bits."""
    T, H, hd = q.shape
    pooled, verifying = ids is not None, verify is not None
    chunk = 1 if pooled or verifying else T  # tokens of one sequence's chunk
    W, half = win.shape[-2], cos.shape[-1]
    picks, all_rows = sel is not None, comp is not None and sel is None  # CSA, HCA
    nw = (1 if verifying else new.shape[-2]) if comp is not None else T  # a row's new windows (NW)
    n_keys = W + chunk + (sel.shape[-1] if picks else (comp.shape[-2] + nw if all_rows else 0))
    rows = (comp, new) if comp is not None else (q, q)  # q: an unread stand-in
    counts = (comp.shape[-2], nw) if comp is not None else (T, T)  # NS, NW (unread without comp)
    masks = (sel, valid, visible) if picks else ((visible, committed, new_visible) if all_rows else (visible,) * 3)
    c = CONFIG
    block_h = min(c["block_h"], next_pow2(H))
    use_dot = block_h >= 16 and hd >= 16
    block_n = c["block_n"] if use_dot else 16
    splits = cdiv(cdiv(n_keys, block_n), c["tiles"])
    f32 = dict(dtype=torch.float32, device=q.device)
    m = torch.empty(T, H, splits, **f32)
    l = torch.empty(T, H, splits, **f32)
    acc = torch.empty(T, H, splits, hd, **f32)
    out = torch.empty_like(q)
    warps = (lambda n: {}) if interpreting() else (lambda n: {"num_warps": n})
    blocks = cdiv(H, block_h)
    fused = c["fused_combine"] and splits <= c["fused_max_splits"]
    tickets = _tickets(T * blocks, q.device) if fused else m
    launcher(_attn_split_kernel, q)[(splits, blocks, T)](
        q, win, kv, visible, *rows, *masks, m, l, acc, ids if pooled else (verify if verifying else q), sink, cos, sin,
        out, tickets, *counts, sel.stride(0) if picks else 0, valid.stride(0) if picks else 0, float(hd ** -0.5),
        T=chunk, H=H, HD=hd, W=W, K=sel.shape[-1] if picks else 0, PICKS=picks, ALL_ROWS=all_rows, SPLITS=splits,
        TILES=c["tiles"], BLOCK_H=block_h, BLOCK_N=block_n, USE_DOT=use_dot,
        DOT_F32=interpreting() and q.dtype != torch.float32, POOLED=pooled, FUSED=fused, NOPE=hd - 2 * half,
        HALF=half, SP=next_pow2(splits), MERGE_D=merge_d(block_h, splits, half),
        **({"VERIFY": True, "RATE": max(rate, 1)} if verifying else {}), **warps(c["num_warps"]))
    if fused:
        return out
    nope = hd - 2 * half
    block_d = min(128, next_pow2(max(nope, 1)))
    split_d = c["combine_split_d"]
    launcher(_attn_combine_kernel, q)[(H, cdiv(nope, block_d) + 1, T) if split_d else (H, T)](
        m, l, acc, sink, cos, sin, out, H=H, HD=hd, NOPE=nope, HALF=half, SPLITS=splits,
        BLOCK_S=next_pow2(splits), BLOCK_D=block_d, SPLIT_D=split_d, **warps(c["combine_warps"]))
    return out


def merge_d(block_h: int, splits: int, half: int) -> int:
    """The fused merge's chunk of head_dim: about MERGE_VALUES fp32 partials a thread, at least one rope pair, at
    most the rope's columns (so that a chunk is all rope or none: the unrotated columns, hd - 2 * half, are a
    multiple of it)."""
    budget = MERGE_VALUES * 32 * CONFIG["num_warps"] // (block_h * splits)
    return max(2, min(2 * half, 1 << max(0, budget.bit_length() - 1)))


def _tickets(count: int, device) -> torch.Tensor:
    """The device's split tickets; before any eager launch made them, a capture's zeroed buffer of its own
    (as hc_boundary's): the fused launch runs either way, so a graph gives the bits of an eager step."""
    tickets = qgemv.tickets_for(count, device)
    return torch.zeros(count, dtype=torch.int32, device=device) if tickets is None else tickets
