"""The MoE router's gate GEMV and the router in one launch (reference: dsv4.kernels.dense's linear, then
dsv4.kernels.route's kernel on its logits).

A routed layer's decode step ran the gate GEMV (dense.py: grid (row groups, N blocks, K splits), each block's
splits summed by its last program) and then the router (route.py: a program a token, the top-k over the logits).
Here the gate's programs are dense.py's, with its sums (_dense_totals) and split reduction (qgemv's _reduce_splits)
unchanged, so the logits are the same bits; each block's reducer then takes a ticket of its row group, and the
reducer of the group's last block routes the group's rows with route.py's arithmetic (_route_row) from the logits
its peers stored (read from L2). The ids and weights are route.py's, bit for bit (bf16 logits: fits); the launch and
the router's DRAM round trip after the GEMV are saved, one a routed layer (Flash: 43 a token).

The bias (a top-k layer's stored weight) is loaded by every program before its wait, as the router loaded it.
"""

import os

import torch

from . import dense, interpreting, launcher, next_pow2, pdl_wait, qgemv
from .dense import _dense_totals
from .qgemv import _group_rows, _reduce_splits
from .route import _route_row, _stored_bias

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # session 43 calls 5-6: its CUDA tests and the gate (benchmarks/RESULTS.md)
# on (DSV4_GATE_ROUTE=0 turns it off): where it applies (fused), a routed layer's gate and router in this launch.
CONFIG = {"on": os.environ.get("DSV4_GATE_ROUTE", "1") == "1"}


def _gate_route_kernel(x_ptr, w_ptr, logits_ptr, p_ptr, tickets_ptr, bias_ptr, tid2eid_ptr, tokens_ptr, ids_ptr,
                       wts_ptr, scale, N, rows, x_stride, K: constexpr, BLOCK_N: constexpr, BLOCK_K: constexpr,
                       SPLITS: constexpr, K_CHUNK: constexpr, EVEN_K: constexpr, ROWS: constexpr, EARLY: constexpr,
                       TOPK: constexpr, TOPK_POW2: constexpr, HASH: constexpr, NORM: constexpr, BLOCK_E: constexpr):
    """dense.py's _dense_kernel (FUSED_SUM) for the gate, logits [rows, N] at logits_ptr, then the route of each row
    of a group by the reducer of its last block: tickets [groups * blocks] for the splits, then [groups] for the
    blocks (each put back to 0)."""
    bias = _stored_bias(bias_ptr, N, HASH, BLOCK_E)
    if not EARLY:
        pdl_wait()
    group = tl.program_id(0)
    nb = tl.program_id(1)
    blocks = tl.num_programs(1)
    rs = _group_rows(group, rows, ROWS)
    n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    totals = _dense_totals(x_ptr, w_ptr, rs, n, n_ok, tl.program_id(2), x_stride, K, BLOCK_N, BLOCK_K, K_CHUNK,
                           EVEN_K, ROWS, EARLY)
    if SPLITS == 1:
        for i in tl.static_range(ROWS):
            tl.store(logits_ptr + rs[i] * N + n, totals[i].to(logits_ptr.dtype.element_ty), mask=n_ok)
        reduced = True
    else:
        reduced = _reduce_splits(totals, group, rows, p_ptr, logits_ptr, tickets_ptr + group * blocks + nb,
                                 tl.program_id(2), n, N, SPLITS)
    if reduced:
        # this block's logits stored by every thread before the group's ticket is taken (as _reduce_splits)
        tl.debug_barrier()
        ticket = tickets_ptr + tl.num_programs(0) * blocks + group
        if tl.atomic_add(ticket, 1, sem="acq_rel", scope="gpu") == blocks - 1:
            for j in range(ROWS):
                r = tl.minimum(group * ROWS + j, rows - 1).to(tl.int64)
                _route_row(logits_ptr + r * N, bias, tid2eid_ptr, tokens_ptr + r, ids_ptr + r * TOPK,
                           wts_ptr + r * TOPK, scale, N, TOPK, TOPK_POW2, HASH, NORM, BLOCK_E)
            tl.store(ticket, 0)


def fits(x: torch.Tensor, gate: torch.Tensor, rows: int, scoring_func: str, kernel: str | None = None) -> bool:
    """Whether gate_route computes route.route(dense.linear(x, gate, kernel=kernel), ...): CONFIG on, bf16 x (the
    logits bf16: the router's fp32 sum of its k weights is then exact, whichever order the launch's warps add them
    in; an fp32 model keeps the two launches), dense.py's v2 kernel for x and the gate (not v3), the router's
    scoring, and tickets to be had."""
    x2 = x.reshape(-1, x.shape[-1])
    if not (CONFIG["on"] and x.dtype == torch.bfloat16 and dense.supported(x, gate, rows)
            and not dense.uses_v3(x2, gate, kernel) and scoring_func == "sqrtsoftplus" and x2.shape[0] > 0):
        return False
    groups, blocks, _ = _grid(x2.shape[0], gate)
    return qgemv.tickets_for(groups * blocks + groups, x.device) is not None


def _grid(rows: int, gate: torch.Tensor) -> tuple[int, int, int]:
    N, K = gate.shape
    block_k, k_chunk, splits = dense.tiling(N, K, gate.dtype)
    per_program = dense.program_rows(rows, block_k, k_chunk)
    return -(-rows // per_program), -(-N // dense.CONFIG["block_n"]), splits


def gate_route(x: torch.Tensor, gate: torch.Tensor, tokens: torch.Tensor, bias, tid2eid, k: int, norm: bool,
               scale: float, stored: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, D] @ gate [E, D]^T, then the route of each row (route.route's): (ids [T, k] int64 ascending, weights
    [T, k] in x's dtype). stored: gate is the model's parameter (dense.linear's), read before the wait under PDL;
    bias [E] (a top-k layer's) the model's stored weight, contiguous."""
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    T, (E, K) = x2.shape[0], gate.shape
    hashed = tid2eid is not None
    if not hashed and (bias is None or not bias.is_contiguous()):
        raise ValueError("gate_route: a top-k layer needs its bias, contiguous (read in place before the wait)")
    block_k, k_chunk, splits = dense.tiling(E, K, gate.dtype)
    per_program = dense.program_rows(T, block_k, k_chunk)
    groups, blocks, _ = _grid(T, gate)
    tickets = qgemv.tickets_for(groups * blocks + groups, x.device)
    if tickets is None:
        raise RuntimeError("gate_route: no tickets (check fits first)")
    logits = torch.empty(T, E, dtype=x.dtype, device=x.device)
    partials = logits if splits == 1 else torch.empty(T, splits, E, dtype=torch.float32, device=x.device)
    ids = torch.empty(T, k, dtype=torch.int64, device=x.device)
    wts = torch.empty(T, k, dtype=x.dtype, device=x.device)
    extra = {} if interpreting() else {"num_warps": dense.CONFIG["num_warps"]}
    launcher(_gate_route_kernel, x2)[(groups, blocks, splits)](
        x2, gate, logits, partials, tickets, logits if hashed else bias, tid2eid if hashed else ids,
        tokens, ids, wts, float(scale), E, T, x2.stride(0), K=K, BLOCK_N=dense.CONFIG["block_n"], BLOCK_K=block_k,
        SPLITS=splits, K_CHUNK=k_chunk, EVEN_K=K % k_chunk == 0, ROWS=per_program, EARLY=stored, TOPK=k,
        TOPK_POW2=next_pow2(k), HASH=hashed, NORM=norm, BLOCK_E=next_pow2(E), **extra)
    return ids, wts


__all__ = ["CONFIG", "GPU_CHECKED", "fits", "gate_route"]
