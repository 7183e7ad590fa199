"""The KV compressor of CSA and HCA layers and the lightning indexer (paper 2.3.1-2.3.2).

A compressor pools every `m` consecutive tokens into one compressed entry:
softmax over the window of (gate + ape) weights the projected rows, then RMSNorm
and RoPE at the window's first position. CSA windows overlap: entry w mixes the
previous window's Ca series with window w's Cb series (2m slots); HCA windows do
not (m slots).

Static shapes for any chunk of T tokens at a device position `pos`: the chunk may
close a data-dependent number of windows, so we compute the fixed number of
windows the chunk can touch and say which of them closed. Rows of earlier
tokens come from a ring of the last R projected rows (R = 2m with overlap).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .norm import rms_norm
from .rope import Rope, apply_rope


@dataclass
class Write:
    """A staged write: `buf[index] = rows` where `keep` (and the step's verdict) hold."""

    buf: torch.Tensor
    index: torch.Tensor
    rows: torch.Tensor
    keep: torch.Tensor | None = None


@dataclass
class Compressed:
    rows: torch.Tensor  # [n_win, dim] candidate entries of the windows this chunk touches
    wids: torch.Tensor  # [n_win] their window ids
    closed: torch.Tensor  # [n_win] bool: the window closed within this chunk


def windows_touched(T: int, m: int) -> int:
    """Most windows a chunk of T tokens can touch, over every alignment of its start."""
    return (T + m - 2) // m + 1


def ring_writes(ring_kv, ring_gate, kv, gate, pos, writes: list[Write]):
    """Stage the last min(T, R) projected rows into their ring slots (slot = position % R)."""
    R, T = ring_kv.shape[0], kv.shape[0]
    n = min(T, R)
    slots = torch.remainder(pos + T - n + torch.arange(n, device=kv.device), R)
    writes.append(Write(ring_kv, slots, kv[T - n:]))
    writes.append(Write(ring_gate, slots, gate[T - n:]))


def compress(x, wkv, wgate, ape, norm_w, ring_kv, ring_gate, pos, m: int, overlap: bool, rope: Rope,
             eps: float, writes: list[Write]) -> Compressed:
    """Compress the windows a chunk x [T, D] touches; stage its ring rows."""
    T = x.shape[0]
    dev = x.device
    kv = torch.nn.functional.linear(x, wkv.dequant(x.dtype))
    gate = torch.nn.functional.linear(x, wgate.dequant(x.dtype))
    R = ring_kv.shape[0]
    dim = kv.shape[-1] // 2 if overlap else kv.shape[-1]
    stream_kv = torch.cat([ring_kv, kv])
    stream_gate = torch.cat([ring_gate, gate])

    def row(q):  # where position q lives in [ring | chunk]
        return torch.where(q < pos, torch.remainder(q, R), R + (q - pos)).clamp(0, R + T - 1)

    n_win = windows_touched(T, m)
    wids = pos // m + torch.arange(n_win, device=dev)
    closed = (wids + 1) * m <= pos + T
    cur = wids.unsqueeze(-1) * m + torch.arange(m, device=dev)  # [n_win, m] positions
    cur_kv = stream_kv[row(cur)]
    cur_gate = stream_gate[row(cur)] + ape
    if overlap:
        prev = cur - m
        live = (prev >= 0).unsqueeze(-1)
        prev_kv = torch.where(live, stream_kv[row(prev)][..., :dim], 0.0)
        prev_gate = torch.where(live, (stream_gate[row(prev)] + ape)[..., :dim], float("-inf"))
        win_kv = torch.cat([prev_kv, cur_kv[..., dim:]], dim=1)
        win_gate = torch.cat([prev_gate, cur_gate[..., dim:]], dim=1)
    else:
        win_kv, win_gate = cur_kv, cur_gate
    pooled = (win_kv * win_gate.softmax(dim=1, dtype=torch.float32).to(win_kv.dtype)).sum(dim=1)
    pooled = rms_norm(pooled, norm_w, eps)
    cos, sin = rope.cos_sin(wids * m, "compress")
    ring_writes(ring_kv, ring_gate, kv, gate, pos, writes)
    return Compressed(apply_rope(pooled, cos, sin), wids, closed)


def stage_entries(store: torch.Tensor, c: Compressed, writes: list[Write]):
    """Stage the closed windows' entries into the compressed rows (row = window id).

    `store` has capacity//m + 2 rows so the touched windows' ids stay distinct modulo its size.
    """
    writes.append(Write(store, torch.remainder(c.wids, store.shape[0]), c.rows, c.closed))


def committed_visible(store: torch.Tensor, pos, m: int) -> torch.Tensor:
    """[Ns] bool: committed row w holds a closed window (w < pos // m); every query of the chunk sees it."""
    return torch.arange(store.shape[0], device=store.device) < pos // m


def index_topk(q_res, x, positions, idx_w, icomp, inew: Compressed, committed, m: int, topk: int,
               rope: Rope, n_heads: int, head_dim: int):
    """Lightning indexer: pick each query's top-k compressed entries (ties to the lowest index).

    Index space: [committed rows 0..Ns) then [this chunk's windows Ns..Ns+n_win).
    Returns (selected [T, K] indices into that space, valid [T, K] bool).
    """
    T = x.shape[0]
    q = torch.nn.functional.linear(q_res, idx_w["wq_b"].dequant(x.dtype)).view(T, n_heads, head_dim)
    cos, sin = rope.cos_sin(positions, "compress")
    q = apply_rope(q, cos, sin).float()
    scores = torch.cat([torch.einsum("thd,nd->thn", q, icomp.float()),
                        torch.einsum("thd,nd->thn", q, inew.rows.float())], dim=-1)
    scores = torch.relu(scores) * head_dim ** -0.5
    weights = torch.nn.functional.linear(x, idx_w["weights_proj"].dequant(x.dtype)).float() * n_heads ** -0.5
    scores = (scores * weights.unsqueeze(-1)).sum(dim=1)  # [T, Ns + n_win]
    visible = torch.cat([committed.expand(T, -1), new_visible(inew, positions, m)], dim=-1)
    scores = scores.masked_fill(~visible, float("-inf"))
    k = min(topk, scores.shape[-1])
    sorted_scores, order = torch.sort(scores, dim=-1, descending=True, stable=True)
    return order[:, :k], sorted_scores[:, :k] > float("-inf")


def new_visible(c: Compressed, positions, m: int):
    """[T, n_win]: this chunk's window w is visible to query q once closed and w < (q+1)//m."""
    return c.closed.unsqueeze(0) & (c.wids.unsqueeze(0) < ((positions + 1) // m).unsqueeze(-1))
