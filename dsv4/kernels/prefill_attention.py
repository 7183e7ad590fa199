"""Prefill attention of one layer in one kernel (reference: dsv4.model.attention._attend).

The reference scores every query of a chunk against the whole chunk ([T, heads, W + T] logits) and
masks; a query sees only its sliding window (itself and the W - 1 keys before it) and its compressed
rows. Here a program (one query, a block of heads) visits its own keys only, in tiles of BLOCK_N
rows, each tile loaded once for every head of the block (MQA: one K=V row per key) and scored as one
[heads, hd] x [hd, keys] tensor-core product, then p * v from the same tile:

    ring W        the window's earlier rows, masked by visible[t, :W]; tiles none of whose keys the
                  query sees are skipped (only the chunk's first W - 1 queries see any ring row)
    chunk band    chunk rows t - W + 1 .. t, masked by visible[t, W + j]
    CSA           pick i is row sel[t, i] of [comp | new], masked by valid[t, i]
    HCA           [comp | new]: comp rows masked by committed, new rows by new_visible[t]

The band is all the kernel reads of visible's chunk part: the kernel equals the reference when
visible[t, W + j] is false outside t - W < j <= t (W = win's rows), as step.Step.sliding builds it
(keys within the window of the query's position; tests/test_prefill_attention.py checks it).

Online softmax in fp32 (logits, max, sums, the output accumulator); p is rounded to the keys' dtype
for the p * v product, as the decode kernel does; the sink joins the denominator only; the output's
rope slice is rotated back at the query position and the output rounded once, to q's dtype.
"""

import torch

from . import cdiv, device_function, interpreting, launcher, next_pow2, pdl_wait

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # session 5: its CUDA tests (Flash shapes against _attend; a tiny fp32 prefill against single steps), prefill_attention_bench, flash prefill at 4k
# block_h heads per program (at least 16: a tensor-core tile; fewer heads are masked rows), block_n keys
# per tile. skip_picks / skip_rows: skip CSA / HCA tiles none of whose keys the query sees (a branch
# around the tile, which keeps Triton from pipelining that loop's loads): the first chunk's early queries
# have invalid picks; HCA's store holds capacity / 128 rows, committed only up to the chunk's start, so
# a short chunk in a large state would otherwise score every row. benchmarks/prefill_attention_bench.py
# times variants.
CONFIG = {"block_h": 64, "block_n": 32, "num_warps": 8, "num_stages": 2, "skip_picks": False, "skip_rows": True}
_NO_MAX = constexpr(-1.0e30)  # a finite "no key yet" running max: exp(_NO_MAX - _NO_MAX) = 1, never NaN


@device_function
def _tile(q, m, l, acc, rows, ok, d, scale, out_ptr, DOT_F32: constexpr):
    """One tile of keys (row pointers `rows`, seen where `ok`) into the running (max, sum, output)."""
    kt = tl.load(rows[:, None] + d[None, :], mask=ok[:, None], other=0.0)  # [BLOCK_N, HD], K = V
    if DOT_F32:  # Triton 3.6's interpreter multiplies 16-bit dot operands as raw bits: widen them (exactly)
        kt = kt.to(tl.float32)
    sc = tl.dot(q, tl.trans(kt), input_precision="ieee")
    sc = tl.where(ok[None, :], sc * scale, float("-inf"))
    m_new = tl.maximum(m, tl.max(sc, axis=1))
    alpha = tl.exp(m - m_new)
    p = tl.exp(sc - m_new[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    pv = tl.dot(p.to(out_ptr.dtype.element_ty).to(kt.dtype), kt, input_precision="ieee")
    return m_new, l, acc * alpha[:, None] + pv


def _prefill_attn_kernel(q_ptr, win_ptr, kv_ptr, vis_ptr, comp_ptr, new_ptr, sel_ptr, ok_ptr, ok_new_ptr, sink_ptr,
                         cos_ptr, sin_ptr, out_ptr, T, K, NS, NW, sel_stride, ok_stride, scale, H: constexpr,
                         HD: constexpr, W: constexpr, NOPE: constexpr, HALF: constexpr, PICKS: constexpr,
                         ALL_ROWS: constexpr, K_TILES: constexpr, ROW_TILES: constexpr,
                         SKIP_PICKS: constexpr, SKIP_ROWS: constexpr,
                         BLOCK_H: constexpr, BLOCK_N: constexpr, DOT_F32: constexpr):
    pdl_wait()
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = h < H
    d = tl.arange(0, HD)
    n = tl.arange(0, BLOCK_N)
    q = tl.load(q_ptr + (t * H + h[:, None]) * HD + d[None, :], mask=h_ok[:, None], other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)
    vis = vis_ptr + t * (W + T)
    m = tl.full([BLOCK_H], _NO_MAX, dtype=tl.float32)
    l = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, HD], dtype=tl.float32)
    for j0 in range(0, W, BLOCK_N):  # the ring
        j = j0 + n
        ok = tl.load(vis + j, mask=j < W, other=0) != 0
        if tl.max(ok.to(tl.int32), axis=0) > 0:
            m, l, acc = _tile(q, m, l, acc, win_ptr + j * HD, ok, d, scale, out_ptr, DOT_F32)
    # the chunk's band: W keys ending at t. Loops run static tile counts (masked at the ends): Triton 3.6's
    # interpreter takes no runtime loop bound (T stays a runtime argument: no variant per chunk length)
    for j0 in range(0, W, BLOCK_N):
        j = t - W + 1 + j0 + n
        ok = tl.load(vis + W + j, mask=(j >= 0) & (j <= t), other=0) != 0
        m, l, acc = _tile(q, m, l, acc, kv_ptr + j * HD, ok, d, scale, out_ptr, DOT_F32)
    if PICKS:  # CSA
        for i0 in range(0, K_TILES * BLOCK_N, BLOCK_N):
            i = i0 + n
            idx = tl.load(sel_ptr + t * sel_stride + i, mask=i < K, other=0)
            ok = tl.load(ok_ptr + t * ok_stride + i, mask=i < K, other=0) != 0
            rows = tl.where(idx < NS, comp_ptr + idx * HD, new_ptr + (idx - NS) * HD)
            if SKIP_PICKS:
                if tl.max(ok.to(tl.int32), axis=0) > 0:
                    m, l, acc = _tile(q, m, l, acc, rows, ok, d, scale, out_ptr, DOT_F32)
            else:
                m, l, acc = _tile(q, m, l, acc, rows, ok, d, scale, out_ptr, DOT_F32)
    if ALL_ROWS:  # HCA: [comp | new] in one loop (a loop more costs registers)
        for j0 in range(0, ROW_TILES * BLOCK_N, BLOCK_N):
            j = j0 + n
            is_new = j >= NS
            ok = tl.where(is_new, tl.load(ok_new_ptr + t * NW + (j - NS), mask=is_new & (j < NS + NW), other=0),
                          tl.load(ok_ptr + j, mask=j < NS, other=0)) != 0
            rows = tl.where(is_new, new_ptr + (j - NS) * HD, comp_ptr + j * HD)
            if SKIP_ROWS:
                if tl.max(ok.to(tl.int32), axis=0) > 0:
                    m, l, acc = _tile(q, m, l, acc, rows, ok, d, scale, out_ptr, DOT_F32)
            else:
                m, l, acc = _tile(q, m, l, acc, rows, ok, d, scale, out_ptr, DOT_F32)

    dt = out_ptr.dtype.element_ty
    sink = tl.load(sink_ptr + h, mask=h_ok, other=0.0).to(dt).to(tl.float32)  # the reference adds it in q's dtype
    mx = tl.maximum(m, sink)
    alpha = tl.exp(m - mx)
    o = acc * (alpha / (l * alpha + tl.exp(sink - mx)))[:, None]
    # the rope slice's (even, odd) pairs rotated by -sin; the pairs before it (c = 1, s = 0) pass unchanged
    even, odd = tl.split(tl.reshape(o, [BLOCK_H, HD // 2, 2]))
    k = tl.arange(0, HD // 2) - NOPE // 2
    c = tl.load(cos_ptr + t * HALF + k, mask=k >= 0, other=1.0)[None, :]
    s = tl.load(sin_ptr + t * HALF + k, mask=k >= 0, other=0.0)[None, :]
    o = tl.reshape(tl.join(even * c + odd * s, odd * c - even * s), [BLOCK_H, HD])
    tl.store(out_ptr + (t * H + h[:, None]) * HD + d[None, :], o.to(dt), mask=h_ok[:, None])


def supported(q, win, kv, visible, sink, cos, sin, comp=None, new=None, sel=None, valid=None, committed=None,
              new_visible=None) -> bool:
    """Shapes the kernel takes (any chunk length); visible's chunk part must lie in the band of win's rows
    (module doc), which the model's masks do by construction: decided from shapes, no device read."""
    T, H, hd = q.shape
    W, half = win.shape[0], cos.shape[-1]
    rows = [x for x in (q, win, kv, comp, new) if x is not None]
    masks = [x for x in (visible, committed, new_visible) if x is not None]
    picks = [x for x in (sel, valid) if x is not None]
    return (T >= 1 and W >= 1 and hd >= 16 and hd == next_pow2(hd) and half == next_pow2(half) and 2 * half <= hd
            and q.dtype in (torch.float32, torch.bfloat16, torch.float16) and q.is_contiguous()
            and tuple(visible.shape) == (T, W + T) and kv.shape[0] == T
            and all(x.is_contiguous() and x.dtype == q.dtype and x.shape[-1] == hd for x in rows)
            and all(x.is_contiguous() and x.dtype == torch.bool for x in masks)
            and all(x.stride(-1) == 1 for x in picks)
            and all(x.is_contiguous() and x.dtype == torch.float32 and x.shape == (T, half) for x in (cos, sin))
            and sink.is_contiguous() and sink.numel() == H)


def tiles(n: int, block: int) -> int:
    """The key tiles a loop runs over n keys: cdiv(n, block) rounded up to a power of two. The count is a compiled
    constant (the interpreter takes no runtime loop bound), and the picks (up to index_topk) and the compressed
    rows grow with a sequence: rounded, a server compiles one variant per doubling instead of one per tile count,
    each ~2 s on an H200 while every request waits (session 15 call 1). A tile past n is all masked: it changes
    no running max, sum or output (exp(-inf) = 0, alpha = 1), and HCA's skips it whole (SKIP_ROWS)."""
    return next_pow2(cdiv(n, block)) if n > 0 else 0


def attention(q, win, kv, visible, sink, cos, sin, comp=None, new=None, sel=None, valid=None, committed=None,
              new_visible=None) -> torch.Tensor:
    """q [T, H, hd] against the window [win; kv] masked by visible [T, W + T], plus CSA's picks
    (comp, new, sel, valid) or HCA's rows (comp, new, committed, new_visible); -> [T, H, hd] in q's dtype."""
    T, H, hd = q.shape
    W, half = win.shape[0], cos.shape[-1]
    picks, all_rows = sel is not None, comp is not None and sel is None  # CSA, HCA
    rows = (comp, new) if comp is not None else (q, q)  # q: an unread stand-in
    masks = (sel, valid, visible) if picks else ((visible, committed, new_visible) if all_rows else (visible,) * 3)
    c = CONFIG
    block_h, block_n = max(16, min(c["block_h"], next_pow2(H))), c["block_n"]
    K, NS, NW = sel.shape[-1] if picks else 0, rows[0].shape[0], rows[1].shape[0] if all_rows else 0
    out = torch.empty_like(q)
    options = {} if interpreting() else {"num_warps": c["num_warps"], "num_stages": c["num_stages"]}
    launcher(_prefill_attn_kernel, q)[(T, cdiv(H, block_h))](
        q, win, kv, visible, *rows, *masks, sink, cos, sin, out, T, K, NS, NW, sel.stride(0) if picks else 0,
        valid.stride(0) if picks else 0, float(hd ** -0.5), H=H, HD=hd, W=W, NOPE=hd - 2 * half, HALF=half,
        PICKS=picks, ALL_ROWS=all_rows, K_TILES=tiles(K, block_n),
        ROW_TILES=tiles(NS + NW, block_n) if all_rows else 0,
        SKIP_PICKS=c["skip_picks"], SKIP_ROWS=c["skip_rows"], BLOCK_H=block_h, BLOCK_N=block_n,
        DOT_F32=interpreting() and q.dtype != torch.float32, **options)
    return out
