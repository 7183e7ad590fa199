"""The KV compressor of CSA and HCA layers and the lightning indexer (paper 2.3.1-2.3.2).

A compressor pools every `m` consecutive tokens into one compressed entry:
softmax over the window of (gate + ape) weights the projected rows, then RMSNorm
and RoPE at the window's first position. CSA windows overlap: entry w mixes the
previous window's Ca series with window w's Cb series (2m slots); HCA windows do
not (m slots).

Static shapes for any chunk of T tokens at a device position `pos`: the chunk may
close a data-dependent number of windows, so it computes the fixed number of
windows it can touch and says which of them closed (see step.Windows). Rows of
earlier tokens come from a ring of the last R projected rows (R = 2m with overlap).
"""

from __future__ import annotations

import torch

from .. import kernels
from ..kernels import compressor as fused
from .commit import Write
from .linear import linear
from .norm import rms_norm
from .rope import apply_rope
from .step import Windows


def project(x, w: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The compressor's (kv, gate) rows of x [T, D] (row-wise: a batched step projects every sequence at once)."""
    return linear(x, w["wkv"]), linear(x, w["wgate"])


def compress(x, w: dict, ring_kv, ring_gate, store, win: Windows, overlap: bool, eps: float,
             writes: list[Write], proj=None, early: bool = False) -> torch.Tensor:
    """Entries [n_win, dim] of the windows a chunk x [T, D] touches; stages its ring rows and closed entries.
    `proj`: the chunk's (kv, gate) when already projected (`project`); early: the caller's word that they and the
    windows were made two or more kernels before the pool (dsv4.kernels.compressor.pool's)."""
    early = early and proj is not None
    kv, gate = proj if proj is not None else project(x, w)
    if kernels.use_triton(kv, gpu_checked=fused.GPU_CHECKED) and fused.pool_supported(
            kv, ring_kv, w["ape"], w["norm"], win.cos, overlap):
        entries = fused.pool(kv, gate, ring_kv, ring_gate, w["ape"], w["norm"], win, overlap, eps, early=early)
    else:
        entries = _pool(kv, gate, ring_kv, ring_gate, w, win, overlap, eps)
    _stage(writes, kv, gate, ring_kv, ring_gate, store, entries, win, None)
    return entries


def _stage(writes: list[Write], kv, gate, ring_kv, ring_gate, store, entries, win: Windows, ids) -> None:
    """A pool's writes: the chunk's last ring rows (pooled, ids: each row's one into its slot's ring), then the
    entries where their window closed."""
    if ids is None:
        T = kv.shape[0]
        n = min(T, ring_kv.shape[0])
        kv, gate = kv[T - n:], gate[T - n:]
    else:
        ring_kv, ring_gate, store = flat(ring_kv), flat(ring_gate), flat(store)
    writes.append(Write(ring_kv, win.slots, kv, win.ring_keep))
    writes.append(Write(ring_gate, win.slots, gate, win.ring_keep))
    writes.append(Write(store, win.store_index, entries, win.store_keep))


def compress_pair(first: tuple, second: tuple, win: Windows, eps: float, writes: list[Write],
                  ids: torch.Tensor | None = None, early: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """`compress` (or, with ids, `compress_pooled`) of two overlapping compressors over the same windows, a CSA
    layer's and its indexer's: each (w, ring_kv, ring_gate, store, proj). One launch for both where the kernel
    takes them (dsv4.kernels.compressor CONFIG pair), else one each; the same entries and the same staged writes,
    in the same order, either way. early: compress's (both projections made two or more kernels back)."""
    (w, ring_kv, ring_gate, store, proj), (w2, ring_kv2, ring_gate2, store2, proj2) = first, second
    a = (*proj, ring_kv, ring_gate, w["ape"], w["norm"])
    b = (*proj2, ring_kv2, ring_gate2, w2["ape"], w2["norm"])
    if not (fused.CONFIG["pair"] and kernels.use_triton(proj[0], gpu_checked=fused.GPU_CHECKED)
            and fused.pair_supported(a, b, win, True)):
        if ids is None:
            return (compress(None, w, ring_kv, ring_gate, store, win, True, eps, writes, proj, early),
                    compress(None, w2, ring_kv2, ring_gate2, store2, win, True, eps, writes, proj2, early))
        return (compress_pooled(w, ring_kv, ring_gate, store, win, True, eps, writes, proj, ids, early),
                compress_pooled(w2, ring_kv2, ring_gate2, store2, win, True, eps, writes, proj2, ids, early))
    entries = fused.pool_pair(a, b, win, True, eps, ids, early=early)
    _stage(writes, *proj, ring_kv, ring_gate, store, entries[0], win, ids)
    _stage(writes, *proj2, ring_kv2, ring_gate2, store2, entries[1], win, ids)
    return entries


def flat(buf: torch.Tensor) -> torch.Tensor:
    """A pool's stacked buffer [slots, rows, ...] as [slots * rows, ...]: what a pooled write's indices address."""
    return buf.view(-1, *buf.shape[2:])


def compress_pooled(w: dict, ring_kv, ring_gate, store, win: Windows, overlap: bool, eps: float,
                    writes: list[Write], proj, ids: torch.Tensor, early: bool = False) -> torch.Tensor:
    """`compress` for one token of each of B pooled sequences (model.step.PoolStep's windows): rings and store
    stacked [slots, ...], proj the rows' (kv, gate) [B, width] -> each row's window entry [B, dim]. The pooled
    kernel only (dsv4.kernels.pooled): it does each row's arithmetic as the row alone does. early: compress's."""
    kv, gate = proj
    if not fused.pool_supported(kv, ring_kv, w["ape"], w["norm"], win.cos, overlap):
        raise RuntimeError("the pooled compressor kernel does not take these shapes/dtypes")
    entries = fused.pool(kv, gate, ring_kv, ring_gate, w["ape"], w["norm"], win, overlap, eps, ids=ids, early=early)
    _stage(writes, kv, gate, ring_kv, ring_gate, store, entries, win, ids)
    return entries


def _pool(kv, gate, ring_kv, ring_gate, w: dict, win: Windows, overlap: bool, eps: float) -> torch.Tensor:
    dim = kv.shape[-1] // 2 if overlap else kv.shape[-1]
    stream_kv = torch.cat([ring_kv, kv])
    stream_gate = torch.cat([ring_gate, gate])
    ape = w["ape"]
    cur_kv = stream_kv[win.cur]
    cur_gate = stream_gate[win.cur] + ape
    if overlap:
        prev_kv = torch.where(win.prev_live, stream_kv[win.prev][..., :dim], 0.0)
        prev_gate = torch.where(win.prev_live, (stream_gate[win.prev] + ape)[..., :dim], float("-inf"))
        win_kv = torch.cat([prev_kv, cur_kv[..., dim:]], dim=1)
        win_gate = torch.cat([prev_gate, cur_gate[..., dim:]], dim=1)
    else:
        win_kv, win_gate = cur_kv, cur_gate
    pooled = (win_kv * win_gate.softmax(dim=1, dtype=torch.float32).to(win_kv.dtype)).sum(dim=1)
    return apply_rope(rms_norm(pooled, w["norm"], eps), win.cos, win.sin)


def index_project(q_res, x, w: dict, n_heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The indexer's queries [T, n_heads, head_dim] and head weights [T, n_heads] (row-wise)."""
    return index_queries(q_res, w, n_heads, head_dim), linear(x, w["weights_proj"])


def index_queries(q_res, w: dict, n_heads: int, head_dim: int) -> torch.Tensor:
    """The indexer's queries alone (its head weights came from a stacked linear of x: dsv4.layout fuse_xproj)."""
    return linear(q_res, w["wq_b"]).view(q_res.shape[0], n_heads, head_dim)


def index_topk(q_res, x, cos, sin, w: dict, icomp, inew, win: Windows, topk: int, n_heads: int, head_dim: int,
               proj=None, prefix: tuple[int, int] | None = None, early: bool = False):
    """Lightning indexer: pick each query's top-k compressed entries (ties to the lowest index).

    Index space: [committed rows 0..Ns) then [this chunk's windows Ns..Ns+n_win).
    Returns (selected [T, K] indices into that space, valid [T, K] bool). `proj`: (q, weights) when
    already projected (`index_project`). `prefix` (n, c): the kernel scores only the store's rows [0, n),
    which hold its c committed ones (model.step.Step.scored_rows); the answer is the same (_as_whole_store).
    early: the caller's word that a kernel (the pool) ran between proj's and the index keys
    (dsv4.kernels.compressor.index_keys').
    """
    early = early and proj is not None
    T = x.shape[0]
    q, weights = proj if proj is not None else index_project(q_res, x, w, n_heads, head_dim)
    if kernels.use_triton(q, gpu_checked=fused.GPU_CHECKED) and fused.index_supported(q, icomp, inew, cos):
        if prefix is not None and prefix[0] < icomp.shape[0]:
            return _topk_over_prefix(q, weights, cos, sin, icomp, inew, win, topk, *prefix, early)
        keys = fused.index_keys(q, weights, cos, sin, icomp, inew, win.committed, win.visible, early=early)
        return fused.topk(keys, min(topk, keys.shape[-1]))
    q = apply_rope(q, cos, sin).float()
    scores = torch.cat([torch.einsum("thd,nd->thn", q, icomp.float()),
                        torch.einsum("thd,nd->thn", q, inew.float())], dim=-1)
    scores = torch.relu(scores) * head_dim ** -0.5
    weights = weights.float() * n_heads ** -0.5
    scores = (scores * weights.unsqueeze(-1)).sum(dim=1)  # [T, Ns + n_win]
    visible = torch.cat([win.committed.expand(T, -1), win.visible], dim=-1)
    scores = scores.masked_fill(~visible, float("-inf"))
    k = min(topk, scores.shape[-1])
    sorted_scores, order = torch.sort(scores, dim=-1, descending=True, stable=True)
    return order[:, :k], sorted_scores[:, :k] > float("-inf")


def _topk_over_prefix(q, weights, cos, sin, icomp, inew, win: Windows, topk: int, n: int, c: int,
                      early: bool = False):
    """The kernel's top-k over the store's rows [0, n) (holding its c committed ones) and the new windows,
    in the whole store's index space."""
    Ns, K = icomp.shape[0], min(topk, icomp.shape[0] + inew.shape[0])
    keys = fused.index_keys(q, weights, cos, sin, icomp[:n], inew, win.committed[:n], win.visible, early=early)
    sel, valid = fused.topk(keys, min(K, keys.shape[-1]))
    return _as_whole_store(sel, valid, n, Ns, c, win.visible, K)


def _as_whole_store(sel, valid, n: int, Ns: int, c: int, visible, K: int):
    """The top-K over [store rows 0..Ns | new windows] from the top-k (k <= K) over [store rows 0..n | new
    windows], when rows [c, Ns) are uncommitted (c <= n). Both put each query's visible entries first, in the
    same order (their keys are the same; new window j is index n + j here, Ns + j there), then the invisible
    ones by ascending index: in the whole store, the rows c..Ns-1, then the query's invisible new windows."""
    n_win = visible.shape[-1]
    ranks = torch.arange(K, device=sel.device)
    seen = valid.sum(dim=-1, keepdim=True)  # visible entries of each query: its first picks
    sel = torch.nn.functional.pad(torch.where(sel >= n, sel + (Ns - n), sel), (0, K - sel.shape[-1]))
    r = ranks - seen  # rank among the invisible entries
    hidden_new = Ns + torch.sort(visible.to(torch.uint8), dim=-1, stable=True).indices  # invisible windows first
    tail = torch.where(r < Ns - c, c + r, hidden_new.gather(1, (r - (Ns - c)).clamp(0, n_win - 1)))
    first = ranks < seen
    return torch.where(first, sel, tail), first


def index_topk_pooled(cos, sin, icomp, inew, win: Windows, topk: int, proj, ids: torch.Tensor, early: bool = False):
    """`index_topk` for one token of each of B pooled sequences: icomp [slots, Ns, dI] stacked, inew [B, 1, dI],
    proj the rows' (q, weights). The keys are distinct, so each row's top-k is what it is alone."""
    q, weights = proj
    if not fused.index_supported(q, icomp, inew, cos):
        raise RuntimeError("the pooled index kernel does not take these shapes/dtypes")
    keys = fused.index_keys(q, weights, cos, sin, icomp, inew, win.committed, win.visible, ids=ids, early=early)
    return fused.topk(keys, min(topk, keys.shape[-1]))
