"""Attention's stacked wq_a / wkv projection with its norms in the same launch (reference: dsv4.model.linear.linear
of x by the stacked weight, then kernels.normrope.q_kv_norms: q's latent RMSNorm, kv's RMSNorm and partial RoPE).

A decode row's q latent and kv are a GEMV of the mHC boundary's output (qgemv's v2 programs: FP8 tiles, K split in
two, the splits summed by the last program of each row block, a ticket) and then two row norms, which ran as their own
launch after it: a Flash rank's chain of one token waited ~4 us a layer on that launch (session 43's rank proxy:
q_kv_norms 3.9-4.7 us of advance, 43 a token). Here the program that sums a row block's splits last also takes a
second ticket, the row group's, and the last row block to finish norms the group's rows from the GEMV's output (read
back from L2) as q_kv_norms' programs do: norm.py's _rms_row for q's latent and normrope's _norm_rope_row for kv, the
same code, at this launch's num_warps (their sums' order follows the warps: q_kv_norms launched at the same warps
gives the same bits, which the capture without tickets uses).

The GEMV's output is the stacked projection (returned too); q_res and kv (normed and roped) are written to tensors of
their own, as q_kv_norms writes them.
"""

from __future__ import annotations

import torch

from ..formats import FP8_BLOCK, QWeight
from . import enabled, interpreting, launcher, next_pow2, normrope, qgemv
from .norm import _rms_row
from .normrope import _norm_rope_row
from .qgemv import _fp8_rows, _group_rows, _operands, _reduce_splits, tickets_for

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # behind dsv4.layout CONFIG qkv_norms (off by default until its GPU A/B: session 44 call 3)


def _qkv_norms_kernel(x_ptr, w_ptr, s_ptr, y_ptr, p_ptr, tickets_ptr, rows, x_stride, row_skew, q_w_ptr, q_out_ptr,
                      kv_w_ptr, cos_ptr, sin_ptr, kv_out_ptr, eps, N: constexpr, K: constexpr, S_STRIDE: constexpr,
                      E8M0: constexpr, BLOCK_N: constexpr, BLOCK_K: constexpr, SPLITS: constexpr, K_CHUNK: constexpr,
                      ROWS: constexpr, UNROLL: constexpr, N_Q: constexpr, Q_BLOCK: constexpr, DIM: constexpr,
                      HALF: constexpr, BLOCK: constexpr, PRE: constexpr = 1):
    """Grid (row blocks, SPLITS, row groups): qgemv's _qgemv2_kernel on a stored FP8 weight [N, K] (EARLY; SPLITS > 1,
    its splits summed through the tickets), y [rows, N]; then the last row block of a group (the group's ticket, after
    the split tickets) norms each row of the group: y's columns 0..N_Q-1 into q_out [rows, N_Q], N_Q..N_Q+DIM-1 into
    kv_out [rows, DIM]."""
    nb = tl.program_id(0)
    split = tl.program_id(1)
    group = tl.program_id(2)
    rs = _group_rows(group, rows, ROWS)
    n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    xs = [x_ptr + r * x_stride for r in rs]
    accs = _fp8_rows(xs, w_ptr, s_ptr, n, N, row_skew, split * K_CHUNK, K_CHUNK, K, S_STRIDE, E8M0, BLOCK_N,
                     BLOCK_K, True, UNROLL, PRE)
    blocks = tl.num_programs(0)
    if _reduce_splits(accs, group, rows, p_ptr, y_ptr, tickets_ptr + group * blocks + nb, split, n, N, SPLITS):
        finish = tickets_ptr + tl.num_programs(2) * blocks + group
        tl.debug_barrier()  # every thread's y stored before the group's ticket is taken
        if tl.atomic_add(finish, 1, sem="acq_rel", scope="gpu") == blocks - 1:
            for j in range(ROWS):  # a row the group repeats is normed twice: the same bits stored twice
                r = tl.minimum(group * ROWS + j, rows - 1).to(tl.int64)
                _rms_row(y_ptr + r * N, q_w_ptr, q_out_ptr + r * N_Q, eps, N_Q, True, Q_BLOCK, ".cg")
                _norm_rope_row(y_ptr + N_Q, kv_w_ptr, cos_ptr, sin_ptr, kv_out_ptr, eps, r, r, 1, DIM, HALF, N, True,
                               BLOCK, ".cg")
            tl.store(finish, 0)


def supported(x: torch.Tensor, w: QWeight, q_w: torch.Tensor, kv_w: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor, n_q: int, rows: int) -> bool:
    """x [T, K], w the stacked FP8 weight [n_q + dim, K] that dsv4.model.linear would run through qgemv's v2 (rows: the
    rows its limit counts, dsv4.model.rows.rows_per_weight) with its K split and the fused split sum, and the two norms
    as q_kv_norms takes them."""
    if not (x.dim() == 2 and x.is_contiguous() and w.fmt == "fp8" and w.data.dim() == 2 and w.row0 == 0
            and qgemv.CONFIG["kernel"] == "v2" and qgemv.CONFIG["v2_fused_sum"] and enabled(qgemv, x)
            and qgemv.supported(x, w, rows) and w.shape[1] == x.shape[1] and 0 < n_q < w.shape[0]):
        return False
    if qgemv.v2_plan(w, x.shape[1], x.shape[0], False).splits < 2:
        return False
    y = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device="meta")  # the GEMV's output, shapes only
    return normrope.q_kv_supported(y[:, :n_q], q_w, y[:, n_q:], kv_w, cos, sin)


def q_kv(x: torch.Tensor, w: QWeight, q_w: torch.Tensor, kv_w: torch.Tensor, eps: float, cos: torch.Tensor,
         sin: torch.Tensor, n_q: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(q_a, q_w), norm_rope(kv_a, kv_w)) of (q_a, kv_a) = x's stacked projection split at n_q, in one launch
    (see the module's doc). Without tickets (a capture before any eager launch) the GEMV and q_kv_norms at this
    launch's warps: the same bits in two launches."""
    rows, K = x.shape
    plan = qgemv.v2_plan(w, K, rows, False)
    N, half, dim = plan.N, cos.shape[-1], w.shape[0] - n_q
    tickets = tickets_for(plan.groups * plan.blocks + plan.groups, x.device)
    if tickets is None:
        y = qgemv.linear(x, w, kernel="v2")
        return normrope.q_kv_norms(y[:, :n_q], q_w, y[:, n_q:], kv_w, eps, cos, sin, num_warps=plan.warps)
    data, scale = _operands(w, words=True)
    y = torch.empty(rows, N, dtype=x.dtype, device=x.device)
    partials = torch.empty(rows, plan.splits, N, dtype=torch.float32, device=x.device)
    q_out = torch.empty(rows, n_q, dtype=x.dtype, device=x.device)
    kv_out = torch.empty(rows, dim, dtype=x.dtype, device=x.device)
    extra = {} if interpreting() else {"num_warps": plan.warps}
    launcher(_qkv_norms_kernel, x)[(plan.blocks, plan.splits, plan.groups)](
        x, data, scale, y, partials, tickets, rows, x.stride(0), w.row0 % FP8_BLOCK, q_w.contiguous(), q_out,
        kv_w.contiguous(), cos, sin.contiguous(), kv_out, float(eps), N=N, K=K, S_STRIDE=scale.shape[-1],
        E8M0=scale.dtype == torch.uint8, BLOCK_N=plan.block_n, BLOCK_K=plan.block_k, SPLITS=plan.splits,
        K_CHUNK=plan.k_chunk, ROWS=plan.per_program, UNROLL=plan.unroll, N_Q=n_q, Q_BLOCK=min(2048, next_pow2(n_q)),
        DIM=dim, HALF=half, BLOCK=next_pow2(dim), **plan.pre, **extra)
    return q_out, kv_out
