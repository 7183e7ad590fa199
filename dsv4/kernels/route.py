"""The MoE router of one token in one kernel (reference: dsv4.model.moe.route).

From the gate's logits: sqrtsoftplus scores (rounded to the logits' dtype after
each of softplus and sqrt, as the reference's two ops round), the top-k of
scores + bias picked by repeated arg-max (ties to the lowest expert id; the
reference's sorted ids come out in ascending order here too), or the hash
layer's frozen `tid2eid[token]` row; then the selected scores normalised to sum 1
and scaled by routed_scaling_factor, in the scores' dtype, summed in id order.
Replaces ~10 launches per layer (softplus, sqrt, add, topk, sort, gather, sum,
add, div, mul).

The top-k layers' bias is a stored weight (no step writes it): it is loaded first and, with DSV4_PDL, the kernel is
launched with launch_pdl and waits (pdl_wait) only then, before the logits; its round trip and the launch overlap
the gate's GEMV. A hash layer's row of tid2eid is picked by the step's token: it waits first, as every kernel.
"""

import torch

from . import device_function, interpreting, launcher, next_pow2, pdl_wait

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # through benchmarks/gpu_checks.sh (session 3): "auto" runs it on CUDA
# Warps of the one program a token: its top-k is ~20 reductions over the experts in a row, each across the warps
# (shared memory and a barrier) at 4 warps, warp shuffles alone at 1. One since session 42 (call 4, decode_ab on mini,
# 6 rounds: graph +0.5 %, pipelined +0.07 %, the same stream; 2 warps lost 0.2-0.4 %).
CONFIG = {"num_warps": 1}


def _route_kernel(logits_ptr, bias_ptr, tid2eid_ptr, tokens_ptr, ids_ptr, w_ptr, scale, E,
                  K: constexpr, K_POW2: constexpr, HASH: constexpr, NORM: constexpr, BLOCK_E: constexpr):
    """HASH: tid2eid's row of the token; else the top-k of the scores plus the bias, loaded before pdl_wait."""
    t = tl.program_id(0).to(tl.int64)
    bias = _stored_bias(bias_ptr, E, HASH, BLOCK_E)
    pdl_wait()
    _route_row(logits_ptr + t * E, bias, tid2eid_ptr, tokens_ptr + t, ids_ptr + t * K, w_ptr + t * K, scale, E, K,
               K_POW2, HASH, NORM, BLOCK_E)


@device_function
def _stored_bias(bias_ptr, E, HASH: constexpr, BLOCK_E: constexpr):
    """A top-k layer's bias [E] in fp32 (a stored weight: loaded before the wait); zeros for a hash layer."""
    e = tl.arange(0, BLOCK_E)
    if HASH:
        return tl.zeros([BLOCK_E], dtype=tl.float32)
    return tl.load(bias_ptr + e, mask=e < E, other=0.0).to(tl.float32)


@device_function
def _route_row(logits_row, bias, tid2eid_ptr, token_ptr, ids_row, w_row, scale, E, K: constexpr, K_POW2: constexpr,
               HASH: constexpr, NORM: constexpr, BLOCK_E: constexpr):
    """One token's route from its logits row (read from L2, .cg: kernels/gate_route.py's writers are programs of the
    same launch) and the bias _stored_bias loaded: ids and weights stored at ids_row and w_row."""
    e = tl.arange(0, BLOCK_E)
    ok = e < E
    dt = logits_row.dtype.element_ty
    x = tl.load(logits_row + e, mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
    # softplus with torch's threshold 20 (beta 1): x itself above it; below, max(x, 0) + log1p(exp(-|x|))
    # with log1p(y) = log(1 + y) * y / ((1 + y) - 1) (exact to rounding where 1 + y loses y's bits)
    y = tl.exp(-tl.abs(x))
    one_y = 1.0 + y
    log1p = tl.where(one_y == 1.0, y, tl.log(one_y) * y / (one_y - 1.0))
    sp = tl.where(x > 20.0, x, tl.maximum(x, 0.0) + log1p)
    score = tl.sqrt(sp.to(dt).to(tl.float32)).to(dt).to(tl.float32)
    j = tl.arange(0, K_POW2)
    ids = tl.zeros([K_POW2], dtype=tl.int64)
    if HASH:
        tok = tl.load(token_ptr).to(tl.int64)
        ids = tl.load(tid2eid_ptr + tok * K + j, mask=j < K, other=0).to(tl.int64)
    else:
        key = tl.where(ok, score + bias, float("-inf"))
        taken = e < 0
        for i in tl.static_range(K):
            best = tl.max(tl.where(taken, float("-inf"), key), axis=0)
            pick = tl.min(tl.where((key == best) & ~taken & ok, e, BLOCK_E), axis=0)
            taken = taken | (e == pick)
        # the picks in ascending id order: the i-th smallest taken id
        rank = tl.cumsum(taken.to(tl.int32), axis=0) - 1
        for i in tl.static_range(K):
            ids = tl.where(j == i, tl.sum(tl.where(taken & (rank == i), e, 0), axis=0).to(tl.int64), ids)
    # each pick's score, gathered by comparing against the row (no scalar loads of a computed index)
    w = tl.zeros([K_POW2], dtype=tl.float32)
    for i in tl.static_range(K):
        id_i = tl.sum(tl.where(j == i, ids, 0), axis=0)
        w = tl.where(j == i, tl.sum(tl.where(e == id_i, score, 0.0), axis=0), w)
    if NORM:
        # the reference sums k values of its dtype in fp32 and rounds once (exact for bf16 values within 2**14 of
        # each other: then the warps' order of the sum, _route_kernel's or gate_route's, changes no bit)
        total = tl.sum(w, axis=0).to(dt).to(tl.float32)
        total = (total + 1e-20).to(dt).to(tl.float32)
        w = (w / total).to(dt).to(tl.float32)
    w = (w * scale).to(dt)
    tl.store(ids_row + j, ids, mask=j < K)
    tl.store(w_row + j, w, mask=j < K)


def supported(logits: torch.Tensor, scoring_func: str) -> bool:
    return scoring_func == "sqrtsoftplus" and logits.is_contiguous() and logits.dim() == 2 and logits.shape[0] > 0


def route(logits, tokens, bias, tid2eid, k: int, norm: bool, scale: float):
    """logits [T, E] -> (ids [T, k] int64 ascending, weights [T, k] in logits' dtype). bias [E] (the top-k layers'):
    the model's stored weight, contiguous (read in place before the kernel waits for the gate's GEMV)."""
    T, E = logits.shape
    ids = torch.empty(T, k, dtype=torch.int64, device=logits.device)
    w = torch.empty(T, k, dtype=logits.dtype, device=logits.device)
    hashed = tid2eid is not None
    if not hashed and (bias is None or not bias.is_contiguous()):
        raise ValueError("route: a top-k layer needs its bias, contiguous (read in place before the wait)")
    launcher(_route_kernel, logits)[(T,)](
        logits, logits if hashed else bias, tid2eid if hashed else ids, tokens, ids, w, float(scale), E,
        K=k, K_POW2=next_pow2(k), HASH=hashed, NORM=norm, BLOCK_E=next_pow2(E),
        **({} if interpreting() else {"num_warps": CONFIG["num_warps"]}))
    return ids, w
