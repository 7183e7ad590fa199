"""A batched decode step's (token, expert) pairs grouped by expert, at most GROUP a group, in one launch.

The tensor-core expert programs (dsv4.kernels.moe_gl, CONFIG grouped) put a pair's token in one column of an
m16n8k16 product; the product has 8 columns. Grouped, the pairs that picked one expert share its weight tiles: each
expert's bytes are read once for up to 8 of the step's tokens instead of once a pair (a concurrency-16 step on
mini: 96 pairs, ~81 distinct experts a layer; at 32, 192 and ~136). A column's sums depend on its own column of the
product only, so a pair's bits are the ungrouped kernel's whatever its group (tests/test_moe_gl.py checks it).

The table has one row a pair, GROUP_ROW int32s: [expert, count, pair 0, ..., pair GROUP - 1]. Row p leads a group
when pair p is the (GROUP m)-th pair (m = 0, 1, ...) in pair order to pick its expert: count is then the group's
pairs (p and the next ones of that expert, at most GROUP), listed in pair order; any other row's count is 0 (its
pair columns are not written). So a consumer's grid stays (..., pairs) for any step, and program p does group p's
work or nothing.

Two forms, the same table. One program (_groups_kernel): a pair's rank (how many earlier pairs picked its expert) and
its expert's total, counted over the pairs in chunks; the ranks go through a scratch row (stored, a barrier, read
back in chunks) so that each pair finds its leader (the pair of its expert whose rank is its own rounded down to a
multiple of GROUP) and writes itself into the leader's row. CONFIG blocks (the default since session 27;
DSV4_EXPERT_GROUPS_BLOCKS=0 for the one program): programs of BLOCK pairs (_groups_blocks_kernel), each scanning the
step's pairs twice, first for the ranks and totals, then for the leader by the expert's running count over the chunks
(a cumulative sum within each), no scratch row and no barrier: each program writes only its own pairs' cells. Session
26 call 3's profile of the one-program form: 6.7 us a layer at 16 rows, 70 at 32 (its [P_PAD, CHUNK] tiles spilling);
session 27 call 1's of the blocks form in the server's pooled step: 8.2 us a layer at 16 rows, 13.2 at 32 (the table's
tests, the gate on mini and the server, its requests' tokens unchanged, passed with it).
"""

import os

import torch

from . import cdiv, launcher, next_pow2, pdl_wait

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # session 26 call 2: its CUDA tests, moe_gl's grouped tests, the gate and the server on mini
CONFIG = {"blocks": os.environ.get("DSV4_EXPERT_GROUPS_BLOCKS", "1") == "1"}
BLOCK = 32  # pairs a program of the blocks form
GROUP = 8  # pairs a group: the columns of one m16n8k16 product
GROUP_ROW = 2 + GROUP
MAX_PAIRS = 1024  # a step's pairs one program counts (P^2 / CHUNK compare steps; 32 tokens x 6: 192)
CHUNK = 32


def _groups_kernel(ids_ptr, table_ptr, rank_ptr, P, P_PAD: constexpr, CHUNK: constexpr, GROUP: constexpr,
                   ROW: constexpr):
    pdl_wait()
    p = tl.arange(0, P_PAD)
    ok = p < P
    e = tl.load(ids_ptr + p, mask=ok, other=-1)
    rank = tl.zeros([P_PAD], dtype=tl.int32)
    total = tl.zeros([P_PAD], dtype=tl.int32)
    for q0 in tl.static_range(0, P_PAD, CHUNK):
        q = q0 + tl.arange(0, CHUNK)
        eq = tl.load(ids_ptr + q, mask=q < P, other=-1)
        same = (e[:, None] == eq[None, :]) & ok[:, None] & (q < P)[None, :]
        rank += tl.sum((same & (q[None, :] < p[:, None])).to(tl.int32), axis=1)
        total += tl.sum(same.to(tl.int32), axis=1)
    tl.store(rank_ptr + p, rank, mask=ok)
    tl.debug_barrier()  # every rank stored before any is read back
    first = (rank // GROUP) * GROUP  # the rank of this pair's leader
    leader = tl.zeros([P_PAD], dtype=tl.int32)
    for q0 in tl.static_range(0, P_PAD, CHUNK):
        q = q0 + tl.arange(0, CHUNK)
        eq = tl.load(ids_ptr + q, mask=q < P, other=-1)
        rq = tl.load(rank_ptr + q, mask=q < P, other=-1)
        hit = (e[:, None] == eq[None, :]) & (rq[None, :] == first[:, None]) & (q < P)[None, :]
        leader += tl.sum(tl.where(hit, q[None, :], 0), axis=1)
    leads = ok & (rank == first)
    row = table_ptr + p.to(tl.int64) * ROW
    tl.store(row, e.to(tl.int32), mask=leads)
    tl.store(row + 1, tl.where(leads, tl.minimum(total - rank, GROUP), 0), mask=ok)
    tl.store(table_ptr + leader.to(tl.int64) * ROW + 2 + (rank - first), p, mask=ok)


def _groups_blocks_kernel(ids_ptr, table_ptr, P, P_PAD: constexpr, BLOCK: constexpr, CHUNK: constexpr,
                          GROUP: constexpr, ROW: constexpr):
    pdl_wait()
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = p < P
    e = tl.load(ids_ptr + p, mask=ok, other=-1)
    rank = tl.zeros([BLOCK], dtype=tl.int32)
    total = tl.zeros([BLOCK], dtype=tl.int32)
    for q0 in range(0, P_PAD, CHUNK):  # P_PAD: a constant bound (the interpreter's range takes no tensor)
        q = q0 + tl.arange(0, CHUNK)
        eq = tl.load(ids_ptr + q, mask=q < P, other=-2)  # never a pair's expert, nor a padding pair's -1
        same = e[:, None] == eq[None, :]
        rank += tl.sum((same & (q[None, :] < p[:, None])).to(tl.int32), axis=1)
        total += tl.sum(same.to(tl.int32), axis=1)
    first = (rank // GROUP) * GROUP  # the rank of this pair's leader
    leader = tl.zeros([BLOCK], dtype=tl.int32)
    seen = tl.zeros([BLOCK], dtype=tl.int32)  # this pair's expert among the pairs before the chunk
    for q0 in range(0, P_PAD, CHUNK):
        q = q0 + tl.arange(0, CHUNK)
        eq = tl.load(ids_ptr + q, mask=q < P, other=-2)
        same = (e[:, None] == eq[None, :]).to(tl.int32)
        before = seen[:, None] + tl.cumsum(same, axis=1) - same  # q's rank, where q picked this pair's expert
        leader += tl.sum(tl.where((same == 1) & (before == first[:, None]), q[None, :], 0), axis=1)
        seen += tl.sum(same, axis=1)
    leads = ok & (rank == first)
    row = table_ptr + p.to(tl.int64) * ROW
    tl.store(row, e.to(tl.int32), mask=leads)
    tl.store(row + 1, tl.where(leads, tl.minimum(total - rank, GROUP), 0), mask=ok)
    tl.store(table_ptr + leader.to(tl.int64) * ROW + 2 + (rank - first), p, mask=ok)


def supported(ids: torch.Tensor) -> bool:
    return ids.dim() == 2 and 0 < ids.numel() <= MAX_PAIRS and not ids.dtype.is_floating_point


def groups(ids: torch.Tensor) -> torch.Tensor:
    """ids [T, k] (expert ids) -> the table [T * k, GROUP_ROW] int32 (see the module's doc)."""
    P = ids.numel()
    flat = ids.contiguous().view(-1)
    table = torch.empty(P, GROUP_ROW, dtype=torch.int32, device=ids.device)
    pad = max(CHUNK, next_pow2(P))
    if CONFIG["blocks"]:
        launcher(_groups_blocks_kernel, ids)[(cdiv(P, BLOCK),)](flat, table, P, P_PAD=pad, BLOCK=BLOCK, CHUNK=CHUNK,
                                                                GROUP=GROUP, ROW=GROUP_ROW, num_warps=4)
        return table
    rank = torch.empty(P, dtype=torch.int32, device=ids.device)
    launcher(_groups_kernel, ids)[(1,)](flat, table, rank, P, P_PAD=pad, CHUNK=CHUNK, GROUP=GROUP, ROW=GROUP_ROW,
                                        num_warps=4 if pad <= 256 else 8)
    return table


def reference(ids: torch.Tensor) -> list[tuple[int, int, list[int]]]:
    """(leading pair, expert, pairs) of each group, leaders ascending: what the table says, from the ids alone."""
    flat = ids.flatten().tolist()
    seen: dict[int, list[int]] = {}
    out = []
    for p, e in enumerate(flat):
        run = seen.setdefault(e, [])
        if len(run) % GROUP == 0:
            out.append((p, e, []))
            run.append(len(out) - 1)
        else:
            run.append(run[-1])
        out[run[-1]][2].append(p)
    return out
