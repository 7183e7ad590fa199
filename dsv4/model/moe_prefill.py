"""Routed experts over many rows (prefill): route first, then run each local expert on its own rows.

The T*k (token, expert) pairs are sorted by local expert id, the pairs of other ranks' experts last,
so each expert's rows form one contiguous group; the group ends come from a searchsorted over the
sorted ids on the device (no host read, no data-dependent shape). One grouped matmul per projection
(torch._grouped_mm) runs every local expert on its group, empty groups included. The results go back
to pair order by a gather and are weighted and summed over k in a fixed order, as the decode path
does, so nothing depends on how a kernel schedules its atomics.

The grouped matmul reads dense weights: this rank's experts of the layer are dequantised for the
call and freed after it, gate|up first, then down (FP4 stacks in one pass by dsv4.kernels.dequant,
else the reference QWeight.dequant a few experts at a time). On Flash with 2 ranks (128 local experts,
I = 2048, D = 4096) that is 4.3 GB (gate|up) then 2.1 GB (down) in bf16 per rank, whatever the
chunk size. A chunk's own activations are a few copies of [T*k, D] and [T*k, I] (the pairs of
other ranks' experts included: the shapes cannot depend on the routing), ~0.4 MB per token on Flash.

Where it runs (FP4 stacks, `fused_runs`), dsv4.kernels.prefill_moe replaces the dequantisation and the
grouped matmul: it reads the stored bytes of the experts the pairs picked, tile by tile, and nothing
dense is made. That is what a short chunk needs most: its cost follows its pairs, not the layer's experts.
"""

from __future__ import annotations

import torch

from .. import kernels
from ..kernels import dequant, prefill_moe
from ..kernels.qgemv import MAX_ROWS
from ..formats import QWeight

# Experts dequantised per step: the reference dequant's int64 index per stored byte is 32 MB per
# Flash expert, so the transient stays ~0.5 GB beside the dense stack.
DEQUANT_STEP = 8


def fused_runs(x: torch.Tensor, experts: dict) -> bool:
    """Whether grouped_experts runs dsv4.kernels.prefill_moe on rows x: more rows than the decode kernels
    take (dsv4.kernels.moe keeps those), FP4 stacks it reads."""
    stacks = [experts[name] for name in ("w1", "w3", "w2")]
    return (x.shape[0] > MAX_ROWS and kernels.use_triton(x, gpu_checked=prefill_moe.GPU_CHECKED)
            and prefill_moe.supported(x, stacks))


def grouped_experts(x: torch.Tensor, local: torch.Tensor, weights: torch.Tensor, experts: dict, act,
                    limit: float | None = None) -> torch.Tensor:
    """sum_j weights[t, j] * expert_{local[t, j]}(x[t]) over this rank's experts (local ids 0..n-1).

    x [T, D]; local [T, k] (ids outside 0..n-1 belong to other ranks); weights [T, k], already 0 for
    them; act(gate, up) is the SwiGLU between the projections, clamping at `limit` (given, the fused
    kernel may run: it computes that activation itself). -> [T, D] in x's dtype.
    """
    T, k = local.shape
    n = experts["w1"].data.shape[0]
    key = torch.where((local >= 0) & (local < n), local, n).flatten()
    key, order = torch.sort(key, stable=True)
    ends = torch.searchsorted(key, torch.arange(n, device=key.device), right=True, out_int32=True)
    if limit is not None and fused_runs(x, experts) and not _dense_chosen(x, experts, T * k, n):
        y = prefill_moe.experts(x, order // k, ends, [experts[name] for name in ("w1", "w3", "w2")], limit)
    else:
        y = _dequantised(x.index_select(0, order // k), ends, experts, act)
    # Rows past the last group (other ranks' pairs) are left unset by the grouped matmul: zero them,
    # since weight 0 times an unset NaN is still NaN.
    y = torch.where((key < n).unsqueeze(-1), y, 0.0)
    back = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
    return (y.index_select(0, back).view(T, k, -1) * weights.unsqueeze(-1)).sum(dim=1)


def _dense_chosen(x: torch.Tensor, experts: dict, pairs: int, n: int) -> bool:
    """Whether the dequantised stacks and torch._grouped_mm run instead of the FP4 kernel: more pairs per local
    expert than prefill_moe.CONFIG's dense_above, and the stacks dequantised by dsv4.kernels.dequant (the torch
    dequantisation is ~10x slower: then the FP4 kernel). Flash on an H200 (session 6, prefill_moe_bench), one
    layer's 128 local experts: at 4,096 tokens 7.3 ms dense against 11.1-23.1 ms in the FP4 kernel."""
    dense_above = prefill_moe.CONFIG["dense_above"]
    if dense_above is None or pairs <= dense_above * n:
        return False
    out = torch.empty(0, device=x.device)
    # The grouped matmul must run without a host read (bf16 on CUDA): a chunk stays capturable.
    dense_mm = _grouped_mm_runs(x, torch.empty(0, 8, x.shape[-1], dtype=x.dtype, device=x.device))
    return dense_mm and kernels.use_triton(out, gpu_checked=dequant.GPU_CHECKED) and all(
        w.fmt == "fp4" and w.scale is not None and w.data.dim() == 3 and w.row0 == 0 and w.col0 == 0
        for w in experts.values())


def _dequantised(rows: torch.Tensor, ends: torch.Tensor, experts: dict, act) -> torch.Tensor:
    """The reference: every local expert dense, one grouped matmul per projection (rows past ends[-1] unset)."""
    gate_up = grouped_mm(rows, dequant_stack([experts["w1"], experts["w3"]], rows.dtype), ends)
    I = gate_up.shape[-1] // 2
    h = act(gate_up[:, :I], gate_up[:, I:])
    del gate_up
    return grouped_mm(h, dequant_stack([experts["w2"]], rows.dtype), ends)


def dequant_stack(stacks: list[QWeight], dtype: torch.dtype) -> torch.Tensor:
    """Stacks [n, O_i, K] of one layer -> one dense [n, sum O_i, K] (w1|w3 side by side: one matmul)."""
    n, K = stacks[0].data.shape[0], stacks[0].shape[1]
    out = torch.empty(n, sum(s.shape[0] for s in stacks), K, dtype=dtype, device=stacks[0].data.device)
    o = 0
    for s in stacks:
        part = out[:, o:o + s.shape[0]]
        o += s.shape[0]
        if kernels.use_triton(out, gpu_checked=dequant.GPU_CHECKED) and dequant.supported(s, part):
            dequant.dequant_into(s, part)
            continue
        for e in range(0, n, DEQUANT_STEP):
            part[e:e + DEQUANT_STEP] = _take(s, slice(e, e + DEQUANT_STEP)).dequant(dtype)
    return out


def _take(stack: QWeight, index) -> QWeight:
    return QWeight(stack.data[index], None if stack.scale is None else stack.scale[index], stack.fmt,
                   stack.row0, stack.col0)


def grouped_mm(a: torch.Tensor, w: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Rows a [P, K] in groups (group g ends at row ends[g]) times w [G, N, K]^T -> [P, N].

    Rows past ends[-1] are unset. torch._grouped_mm where it runs without a host read: bf16 on CUDA
    (its CUTLASS kernel; 16-byte aligned rows), float32/bf16/fp16 on CPU. Elsewhere an exact loop.
    """
    if _grouped_mm_runs(a, w):
        return torch._grouped_mm(a, w.transpose(-1, -2), offs=ends)
    return _grouped_mm_loop(a, w, ends)


def _grouped_mm_runs(a: torch.Tensor, w: torch.Tensor) -> bool:
    if not hasattr(torch, "_grouped_mm"):
        return False
    if a.is_cuda:
        # Other dtypes take torch's own fallback, which reads the offsets on the host.
        return a.dtype == w.dtype == torch.bfloat16 and a.shape[-1] % 8 == 0 and w.shape[1] % 8 == 0
    return a.dtype == w.dtype and a.dtype in (torch.float32, torch.bfloat16, torch.float16)


def _grouped_mm_loop(a: torch.Tensor, w: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """One matmul per non-empty group. Reads the group ends on the host, so a chunk on this path
    (float64, or a non-bf16 CUDA dtype) is not capturable; it is exact and does only the pairs' work."""
    out = a.new_zeros(a.shape[0], w.shape[1])
    start = 0
    for g, end in enumerate(ends.tolist()):
        if end > start:
            out[start:end] = a[start:end] @ w[g].T
        start = end
    return out
