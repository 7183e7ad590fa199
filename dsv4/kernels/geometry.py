"""A step's geometry in one launch each (references: dsv4.model.step's Step / PoolStep `sliding` and
`_make_windows`): which keys each query sees, where a step's rows land in the rings and stores, and the
windows of a compression rate the step touches.

The torch references take ~40 small integer launches per rate and ~10 for the sliding window, every step.
Here one program per sequence row writes every field of a rate's Windows (the store's `committed` mask
over its rows split over programs), and one the sliding window's mask and ring slots. Integer arithmetic
only, so the fields are the reference's exactly; Python's modulo (non-negative, as torch.remainder) is
spelt out, since Triton's % truncates. The window starts come out as fp32 positions for the rope tables
(an int64's conversion to fp32 rounds the same in both).

Rows: a plain step is one row (B = 1) of T tokens; a pooled step (dsv4.model.step.PoolStep) is B rows of
one token, each with its own position, whose ring and store indices address its slot ids[b] of the pool's
flattened buffers.
"""

import os

import torch

from . import cdiv, device_function, launcher, next_pow2, pdl_wait

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # session 6, call 7: its CUDA tests, test_replay_gpu and test_pool under triton, flash decode
COMMITTED_BLOCK = 1024  # store rows of the committed mask per program
# chunks (DSV4_GEOMETRY_CHUNKS=0 turns it off): a prefill chunk of up to CHUNK_T tokens (a server's short chunks)
# takes its geometry here too, from the chunk kernels (its length an argument: one compile per power of two of it,
# not per length), where the torch reference costs ~50 small launches a sequence (a concurrency-16 wave: ~800 of its
# ~2,550 launches, session 23). Integers only: the reference's fields exactly. Session 24 call 1 (mini, one H200): a
# 16 x 63 wave 98.6 -> 86.8 ms, its digest unchanged.
CONFIG = {"chunks": os.environ.get("DSV4_GEOMETRY_CHUNKS", "1") == "1"}
CHUNK_T = 128
VISIBLE_BLOCK = 16384  # a sliding program's [T_P2, keys] block of the visible mask at most


def _windows_kernel(pos_ptr, ids_ptr, active_ptr, wids_ptr, starts_ptr, closed_ptr, cur_ptr, prev_ptr, live_ptr,
                    slots_ptr, index_ptr, keep_ptr, committed_ptr, visible_ptr, R, ROWS, T: constexpr, M: constexpr,
                    NW: constexpr, NS: constexpr, NW_P2: constexpr, M_P2: constexpr, T_P2: constexpr,
                    NS_P2: constexpr, BLOCK: constexpr, POOLED: constexpr, ACTIVE: constexpr):
    _windows_rows(pos_ptr, ids_ptr, active_ptr, wids_ptr, starts_ptr, closed_ptr, cur_ptr, prev_ptr, live_ptr,
                  slots_ptr, index_ptr, keep_ptr, committed_ptr, visible_ptr, R, ROWS, T, M, NW, NS, NW_P2, M_P2, T_P2,
                  NS_P2, BLOCK, POOLED, ACTIVE)


def _windows_chunk_kernel(pos_ptr, active_ptr, wids_ptr, starts_ptr, closed_ptr, cur_ptr, prev_ptr, live_ptr,
                          slots_ptr, index_ptr, keep_ptr, committed_ptr, visible_ptr, R, ROWS, T, NW, NS,
                          M: constexpr, NW_P2: constexpr, M_P2: constexpr, T_P2: constexpr, NS_P2: constexpr,
                          BLOCK: constexpr, ACTIVE: constexpr):
    """_windows_kernel for a prefill chunk (CONFIG chunks): its tokens, windows and ring rows as arguments, not
    constants, so that chunks of every length up to CHUNK_T share a compile per power of two."""
    _windows_rows(pos_ptr, pos_ptr, active_ptr, wids_ptr, starts_ptr, closed_ptr, cur_ptr, prev_ptr, live_ptr,
                  slots_ptr, index_ptr, keep_ptr, committed_ptr, visible_ptr, R, ROWS, T, M, NW, NS, NW_P2, M_P2, T_P2,
                  NS_P2, BLOCK, False, ACTIVE)


@device_function
def _windows_rows(pos_ptr, ids_ptr, active_ptr, wids_ptr, starts_ptr, closed_ptr, cur_ptr, prev_ptr, live_ptr,
                  slots_ptr, index_ptr, keep_ptr, committed_ptr, visible_ptr, R, ROWS, T, M: constexpr, NW, NS,
                  NW_P2: constexpr, M_P2: constexpr, T_P2: constexpr, NS_P2: constexpr, BLOCK: constexpr,
                  POOLED: constexpr, ACTIVE: constexpr):
    pdl_wait()
    b = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + b)
    r = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    tl.store(committed_ptr + b * ROWS + r, r < pos // M, mask=r < ROWS)
    if tl.program_id(1) == 0:
        slot = tl.load(ids_ptr + b) if POOLED else b * 0
        j = tl.arange(0, NW_P2)
        j_ok = j < NW
        wids = pos // M + j
        closed = (wids + 1) * M <= pos + T
        keep = closed
        if ACTIVE:
            keep = closed & (tl.load(active_ptr + b) != 0)
        tl.store(wids_ptr + b * NW + j, wids, mask=j_ok)
        tl.store(starts_ptr + b * NW + j, (wids * M).to(tl.float32), mask=j_ok)
        tl.store(closed_ptr + b * NW + j, closed, mask=j_ok)
        tl.store(keep_ptr + b * NW + j, keep, mask=j_ok)
        tl.store(index_ptr + b * NW + j, slot * ROWS + wids % ROWS, mask=j_ok)  # wids >= 0

        i = tl.arange(0, M_P2)
        cell = b * NW * M + j[:, None] * M + i[None, :]
        ok = j_ok[:, None] & (i < M)[None, :]
        q = wids[:, None] * M + i[None, :]
        tl.store(cur_ptr + cell, _stream_row(q, pos, R, T), mask=ok)
        tl.store(prev_ptr + cell, _stream_row(q - M, pos, R, T), mask=ok)
        tl.store(live_ptr + cell, q - M >= 0, mask=ok)

        s = tl.arange(0, NS_P2)
        tl.store(slots_ptr + b * NS + s, slot * R + (pos + T - NS + s) % R, mask=s < NS)  # >= 0

        t = tl.arange(0, T_P2)
        seen = closed[None, :] & (wids[None, :] < ((pos + t + 1) // M)[:, None])
        tl.store(visible_ptr + b * T * NW + t[:, None] * NW + j[None, :], seen, mask=(t < T)[:, None] & j_ok[None, :])


@device_function
def _stream_row(q, pos, R, T):
    """Where position q lives in the stream [ring | chunk] (model.step's stream_row): q mod R (Python's, q may
    be negative) before the chunk, R + q - pos within it, clamped to the stream."""
    ring = ((q % R) + R) % R
    return tl.minimum(tl.maximum(tl.where(q < pos, ring, R + (q - pos)), 0), R + T - 1)


def _sliding_kernel(pos_ptr, ids_ptr, visible_ptr, slots_ptr, W, T: constexpr, NS: constexpr, BLOCK: constexpr,
                    T_P2: constexpr, NS_P2: constexpr, POOLED: constexpr):
    _sliding_rows(pos_ptr, ids_ptr, visible_ptr, slots_ptr, W, T, NS, BLOCK, T_P2, NS_P2, POOLED)


def _sliding_chunk_kernel(pos_ptr, visible_ptr, slots_ptr, W, T, NS, BLOCK: constexpr, T_P2: constexpr,
                          NS_P2: constexpr):
    """_sliding_kernel for a prefill chunk (CONFIG chunks): T and NS arguments, as _windows_chunk_kernel's."""
    _sliding_rows(pos_ptr, pos_ptr, visible_ptr, slots_ptr, W, T, NS, BLOCK, T_P2, NS_P2, False)


@device_function
def _sliding_rows(pos_ptr, ids_ptr, visible_ptr, slots_ptr, W, T, NS, BLOCK: constexpr, T_P2: constexpr,
                  NS_P2: constexpr, POOLED: constexpr):
    pdl_wait()
    b = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + b)
    last = pos - 1
    k = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ring_pos = last - (((last - k) % W) + W) % W
    key = tl.where(k < W, ring_pos, pos + (k - W))
    t = tl.arange(0, T_P2)
    q = (pos + t)[:, None]
    seen = (key[None, :] >= 0) & (key[None, :] <= q) & (key[None, :] > q - W)
    tl.store(visible_ptr + b * T * (W + T) + t[:, None] * (W + T) + k[None, :], seen,
             mask=(t < T)[:, None] & (k < W + T)[None, :])
    if tl.program_id(1) == 0:
        slot = tl.load(ids_ptr + b) if POOLED else b * 0
        s = tl.arange(0, NS_P2)
        tl.store(slots_ptr + b * NS + s, slot * W + (pos + T - NS + s) % W, mask=s < NS)


MAX_T = 8  # tokens per sequence: decode steps (a program holds a [T, keys] block; longer chunks: CONFIG chunks)
# the chunk kernels' lengths are arguments: one compile for every value, not one per value that is 1 or a multiple of 16
_windows_chunk_kernel.do_not_specialize = ("T", "NW", "NS")
_sliding_chunk_kernel.do_not_specialize = ("T", "NS")


def supported(pos: torch.Tensor, T: int) -> bool:
    return (pos.dtype == torch.int64 and pos.dim() <= 1 and pos.is_contiguous()
            and (1 <= T <= MAX_T or (CONFIG["chunks"] and MAX_T < T <= CHUNK_T and pos.dim() == 0)))


WINDOW_FIELDS = ("wids", "starts", "closed", "cur", "prev", "prev_live", "slots", "store_index", "store_keep",
                 "committed", "visible")  # the kernels' output pointers, in order


def windows(pos: torch.Tensor, T: int, m: int, R: int, rows: int, n_win: int, ids=None, active=None) -> dict:
    """The Windows fields but the rope tables and ring_keep, for a plain step (pos 0-dim, T tokens, n_win windows)
    or a pooled one (pos [B], ids [B], T = n_win = 1; each field with a leading row axis, the single window's
    axis dropped); plus `starts`, the windows' first positions in fp32."""
    pooled = ids is not None
    B = pos.shape[0] if pooled else 1
    ns = min(T, R)
    dev = pos.device
    i64, boolean = dict(dtype=torch.int64, device=dev), dict(dtype=torch.bool, device=dev)
    out = dict(wids=torch.empty(B, n_win, **i64), starts=torch.empty(B, n_win, dtype=torch.float32, device=dev),
               closed=torch.empty(B, n_win, **boolean), cur=torch.empty(B, n_win, m, **i64),
               prev=torch.empty(B, n_win, m, **i64), prev_live=torch.empty(B, n_win, m, 1, **boolean),
               slots=torch.empty(B, ns, **i64), store_index=torch.empty(B, n_win, **i64),
               store_keep=torch.empty(B, n_win, **boolean), committed=torch.empty(B, rows, **boolean),
               visible=torch.empty(B, T, n_win, **boolean))
    grid, fields = (B, cdiv(rows, COMMITTED_BLOCK)), [out[k] for k in WINDOW_FIELDS]
    sizes = dict(M=m, NW_P2=next_pow2(n_win), M_P2=next_pow2(m), T_P2=next_pow2(T), NS_P2=next_pow2(ns),
                 BLOCK=COMMITTED_BLOCK, ACTIVE=active is not None)
    if T > MAX_T:  # a prefill chunk's (supported: CONFIG chunks): its block sizes from T_P2 alone, one compile each
        t_p2 = sizes["T_P2"]
        sizes.update(NW_P2=next_pow2(max(n_win, (t_p2 + m - 2) // m + 1)), NS_P2=next_pow2(min(t_p2, R)))
        launcher(_windows_chunk_kernel, pos)[grid](pos, active if active is not None else pos, *fields, R, rows, T,
                                                   n_win, ns, **sizes)
    else:
        launcher(_windows_kernel, pos)[grid](pos, ids if pooled else pos, active if active is not None else pos,
                                             *fields, R, rows, T=T, NW=n_win, NS=ns, POOLED=pooled, **sizes)
    if pooled:  # one window, one token and one ring row per sequence row: that axis dropped
        return {k: v if k == "committed" else (v.view(B, 1) if k == "visible" else v.squeeze(1))
                for k, v in out.items()}
    return {k: v[0] for k, v in out.items()}


def sliding(pos: torch.Tensor, T: int, W: int, ids=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(visible [T, W + T], ring slots [min(T, W)]) of a plain step; pooled (pos [B], ids [B], T = 1): visible
    [B, W + 1] and each row's flat ring row [B]."""
    pooled = ids is not None
    B = pos.shape[0] if pooled else 1
    ns = min(T, W)
    visible = torch.empty(B, T, W + T, dtype=torch.bool, device=pos.device)
    slots = torch.empty(B, ns, dtype=torch.int64, device=pos.device)
    block = min(1024, next_pow2(W + T))
    if T > MAX_T:  # a prefill chunk's (supported: CONFIG chunks)
        t_p2 = next_pow2(T)  # the block sizes from T_P2 alone: one compile for every chunk length up to it
        block = min(1024, next_pow2(W + t_p2), max(16, VISIBLE_BLOCK // t_p2))
        launcher(_sliding_chunk_kernel, pos)[(B, cdiv(W + T, block))](
            pos, visible, slots, W, T, ns, BLOCK=block, T_P2=t_p2, NS_P2=next_pow2(min(t_p2, W)))
    else:
        launcher(_sliding_kernel, pos)[(B, cdiv(W + T, block))](
            pos, ids if pooled else pos, visible, slots, W, T=T, NS=ns, BLOCK=block, T_P2=next_pow2(T),
            NS_P2=next_pow2(ns), POOLED=pooled)
    if pooled:
        return visible.view(B, W + 1), slots.view(B)
    return visible[0], slots[0]
