"""Mixture of experts (paper 2.1): hash or sqrtsoftplus routing, routed experts, shared expert.

Router: scores = score_func(x W_g^T). Hash layers take the experts from the
frozen `tid2eid[token]` table; the others take the top-k of scores + bias (the
aux-loss-free correction bias only selects, it does not weight). The selected
scores are normalised to sum 1 and scaled by `routed_scaling_factor`.
Experts are SwiGLU with the gate clamped above and the up projection clamped
both ways at `swiglu_limit`.

Expert parallelism: a rank owns the contiguous id range `experts`, stacked so a
selected expert's weights are gathered by a device index (no host sync). The
output is a partial sum: this rank's routed experts plus its slice of the
shared expert.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import kernels
from ..config import ModelConfig
from ..kernels import gate_route, lanes, moe_gl
from ..kernels import moe as fused_moe
from ..kernels import moe_tc
from ..kernels import route as fused_route
from ..kernels.qgemv import MAX_ROWS
from .linear import dequantised, expert_linear, experts_fused, linear
from .rows import per_row, rows_per_weight, short_chunk, step_gemv, tokens_per_sequence
from ..formats import QWeight
from .moe_prefill import fused_runs, grouped_experts


def score(logits: torch.Tensor, func: str) -> torch.Tensor:
    if func == "sqrtsoftplus":
        return F.softplus(logits).sqrt()
    if func == "sigmoid":
        return torch.sigmoid(logits)
    return torch.softmax(logits, dim=-1)


def route(x, tokens, w: dict, cfg: ModelConfig):
    """-> (expert ids [T, k], weights [T, k])."""
    if kernels.use_triton(x, gpu_checked=gate_route.GPU_CHECKED) and w["gate"].fmt == "dense":
        gate = dequantised(w["gate"], x)
        if gate_route.fits(x, gate, rows_per_weight(x), cfg.scoring_func, step_gemv()):
            return gate_route.gate_route(x, gate, tokens, w.get("bias"), w.get("tid2eid"), cfg.num_experts_per_tok,
                                         cfg.norm_topk_prob, cfg.routed_scaling_factor, stored=gate is w["gate"].data)
    logits = linear(x, w["gate"])
    if kernels.use_triton(logits, gpu_checked=fused_route.GPU_CHECKED) and fused_route.supported(logits,
                                                                                                 cfg.scoring_func):
        return fused_route.route(logits, tokens, w.get("bias"), w.get("tid2eid"), cfg.num_experts_per_tok,
                                 cfg.norm_topk_prob, cfg.routed_scaling_factor)
    return _route(logits, tokens, w, cfg)


@per_row(1)
def _route(logits, tokens, w: dict, cfg: ModelConfig):
    scores = score(logits, cfg.scoring_func)
    if "tid2eid" in w:
        ids = w["tid2eid"][tokens]
    else:
        # Unsorted CUDA top-k returns its picks in a scheduling-dependent order; sorting the ids
        # makes the weighted sum over experts add in one order, so eager and replay agree bit for bit.
        ids = torch.topk(scores + w["bias"], cfg.num_experts_per_tok, dim=-1, sorted=False).indices.sort(-1).values
    weights = scores.gather(1, ids)
    if cfg.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return ids, weights * cfg.routed_scaling_factor


def _swiglu(gate, up, limit: float):
    """What sits between an expert's projections: silu(gate clamped above) * (up clamped both ways)."""
    return F.silu(gate.clamp(max=limit)) * up.clamp(min=-limit, max=limit)


swiglu_act = per_row(1)(_swiglu)  # row by row under rows_alone: a CPU kernel's vector body and tail round apart


def swiglu(x, w1, w3, w2, limit: float):
    """One expert on rows x [N, D] with dense weights (w1/w3 [.., I, D], w2 [.., D, I]); batched if 3-D."""
    mm = torch.matmul
    return mm(swiglu_act(mm(x, w1.transpose(-1, -2)), mm(x, w3.transpose(-1, -2)), limit), w2.transpose(-1, -2))


def take(stack: QWeight, index: torch.Tensor) -> QWeight:
    return QWeight(stack.data[index], None if stack.scale is None else stack.scale[index], stack.fmt,
                   stack.row0, stack.col0)


PAIR_ROWS = MAX_ROWS  # tokens per gather of the reference's per-pair path: a decode step's rows, at most


def routed(x, ids, weights, experts: dict, first: int, cfg: ModelConfig, shared=None, out=None,
           h=None, groups=None, early: bool = False, prefetch: bool = False) -> torch.Tensor:
    """Sum over this rank's experts (ids first..first+n-1) of weight * expert(x), plus `shared` (the shared
    expert's output, or None): the routed sum rounded, then `+ shared` rounded once (the fused kernel may add
    it in its own store: dsv4.kernels.moe.CONFIG["shared_add"]). out [T, D]: where the fused kernels write the
    result when they run (the door's payload: dsv4.parallel.Comm.payload); the result is what is returned.
    h: the fused kernel 1's output when moe() already ran it (with the shared expert's: _fused_routed holds), groups
    the table of pairs by expert it ran with (dsv4.kernels.moe.groups_for, or None).

    Rows alone (decode steps and short prefill chunks: model.rows.short_chunk) always take the per-(token,
    expert) path, whatever their number: the grouped path's sums would depend on which other rows share the
    step. For a short chunk that is also the fast path: the decode kernels, one GEMV row per pair, read each
    pair's expert once, where the grouped paths pay for unpacking (or dequantising) the layer's experts whole.
    A prefill chunk's rows (more than one token a sequence) run on the tensor cores instead (dsv4.kernels.moe_tc,
    DSV4_MOE_TC), in tiles of one fixed shape: each row's bits still its own, and the choice follows the step's
    kind, never the sequences in it. A long chunk (not rows alone) takes them too while its pairs per expert are
    few (moe_tc's CONFIG long: tiles by that count), else the grouped path."""
    T, k = ids.shape
    n = experts["w1"].data.shape[0]
    limit = cfg.swiglu_limit
    alone = rows_per_weight(x) == 1
    stacks = _stacks(experts)
    # A chunk past the decode kernels' rows takes the grouped path when its FP4 kernel runs: that reads
    # only the experts picked, where the gather below dequantises a copy of one per (token, expert) pair.
    if alone or (T * k <= n and not fused_runs(x, experts)):
        if h is None and _tensor_cores(x, ids, experts):
            return moe_tc.routed(x, ids, weights.to(x.dtype), stacks, first, limit, shared, out,
                                 _wave_tiles(x, ids, experts, cfg))
        if _fused_routed(x, ids, experts):
            # Two launches on the stored bytes; experts of other ranks are skipped unread, their weights
            # too, so they need no zeroing (_local's five launches a layer).
            return fused_moe.routed(x, ids, weights.to(x.dtype), stacks, first, limit, shared, out, h, groups,
                                    early and h is not None, prefetch)
        local, weights = _local(ids, weights, first, n, x.dtype)
        e = local.clamp(0, n - 1)
        # PAIR_ROWS tokens at a time: a short chunk's dequantised copies stay a few tokens' experts (Flash: 50 MB
        # a pair in bf16), and a decode step's tokens are one block, as they always were.
        blocks = [_pairs(x[r:r + PAIR_ROWS], e[r:r + PAIR_ROWS], weights[r:r + PAIR_ROWS], stacks, limit)
                  for r in range(0, T, PAIR_ROWS)]
        return _plus(blocks[0] if len(blocks) == 1 else torch.cat(blocks), shared)
    tiles = _long_tiles(x, ids, experts, cfg)
    if tiles is not None:
        # A long chunk with few pairs an expert: the tensor-core tiles read the picked experts' stored bytes, where
        # the grouped path below dequantises every local expert of the layer (moe_tc.CONFIG long).
        return moe_tc.routed(x, ids, weights.to(x.dtype), stacks, first, limit, shared, out, tiles)
    # Many tokens (prefill): each local expert runs on the rows routed to it (one grouped matmul).
    local, weights = _local(ids, weights, first, n, x.dtype)
    return _plus(grouped_experts(x, local, weights, experts, lambda gate, up: swiglu_act(gate, up, limit), limit),
                 shared)


def _tensor_cores(x, ids, experts: dict) -> bool:
    """Whether routed() runs these rows' experts on the tensor cores (dsv4.kernels.moe_tc): where the fused kernels
    would, and the step's kind is the one moe_tc's mode names (a prefill chunk's, or every step's)."""
    return (_fused_routed(x, ids, experts) and kernels.enabled(moe_tc, x)
            and moe_tc.chosen(x, _stacks(experts), tokens_per_sequence()))


def _long_tiles(x, ids, experts: dict, cfg: ModelConfig) -> tuple[int, int] | None:
    """moe_tc's tiles for a long prefill chunk's experts (moe_tc.long_tiles, by the chunk's pairs per expert), or
    None: the grouped path."""
    T, k = ids.shape
    if not kernels.enabled(moe_tc, x):
        return None
    return moe_tc.long_tiles(x, _stacks(experts), T * k / cfg.n_routed_experts)


def _wave_tiles(x, ids, experts: dict, cfg: ModelConfig) -> tuple[int, int] | None:
    """moe_tc's tiles for a rows-alone chunk step (short prefill chunks, one sequence's or a grouped wave's): None,
    CONFIG's one shape; with moe_tc CONFIG wave_tiles (on since session 25; DSV4_MOE_TC_WAVE_TILES=0 turns it off)
    the long chunks' table by the step's pairs per expert. A pair's bits do not depend on a tile's rows (sm_90's
    wgmma is 64 rows whatever BLOCK_M, and CONFIG order "auto" keeps the planes' bits at every tile; bit_equal_tc in
    every prefill_moe_bench arm, tests/test_moe_tc.py), so a row alone keeps its bits in a wave of other tiles: a
    concurrency-16 server's 16 x 63 wave has ~24 pairs an expert, where 32-row tiles took 4.4 ms a layer of mini's
    experts against 16-row tiles' 6.0 (session 22 call 1, 1,024 tokens); session 25 call 1, the wave in one process:
    88.4 -> 82.7 ms, 71.8 -> 58.1 with the shared expert's tiles (dsv4.kernels.moe CONFIG shared_prefill_tiles)."""
    if not moe_tc.CONFIG["wave_tiles"]:
        return None
    return _long_tiles(x, ids, experts, cfg)


def wave_tile_waves(cfg: ModelConfig, slots: int, longest: int, group_tokens: int,
                    done: list[tuple[int, int]] = ()) -> list[tuple[int, int]]:
    """(sequences, tokens each) of grouped short-chunk waves that between them take each of moe_tc's wave tiles
    (_wave_tiles: the long chunks' table by a wave's pairs per expert) that a server's waves reach, `slots`
    sequences with chunks of at most `longest` tokens and `group_tokens` tokens a forward, and that none of the
    waves `done` took: for each tile the fewest sequences of the longest short chunk whose pairs pass the tile's
    lower bound. None without wave_tiles. A warm-up runs them (dsv4.serve.scheduler.warm_prefill)."""
    if not moe_tc.CONFIG["wave_tiles"]:
        return []
    experts, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    bounds = [bound for bound, _, _ in moe_tc.CONFIG["long"]]

    def tile(n: int, t: int) -> int | None:
        return next((i for i, bound in enumerate(bounds) if n * t * k / experts <= bound), None)

    taken = {tile(n, t) for n, t in done if short_chunk(t)}
    t = max((n for n in range(1, longest + 1) if short_chunk(n)), default=0)
    waves, lower = [], 0
    for i, bound in enumerate(bounds):
        n = int(lower * experts // (k * t)) + 1 if t else 0
        if i not in taken and 0 < n <= slots and n * t <= group_tokens and tile(n, t) == i:
            waves.append((n, t))
        lower = bound
    return waves


def long_tile_chunks(cfg: ModelConfig, longest: int) -> list[int]:
    """Long prefill chunk lengths, at most `longest`, that between them take each of moe_tc's long tiles (CONFIG
    long, by pairs per expert): per tile shape the longest such chunk made a multiple of 16 and one token less, the
    two variants Triton compiles of a length. A warm-up runs them (dsv4.serve.scheduler.warm_prefill)."""
    lengths, shortest = [], fused_moe.CONFIG["prefill_pair_tokens"]
    for bound, _, _ in moe_tc.CONFIG["long"]:
        top = min(longest, int(bound * cfg.n_routed_experts // cfg.num_experts_per_tok))
        top -= top % 16
        lengths += [n for n in (top, top - 1) if n > shortest and n not in lengths]
        shortest = max(shortest, top)
    return lengths


def _stacks(experts: dict) -> list[QWeight]:
    return [experts[name] for name in ("w1", "w3", "w2")]


def _fused_routed(x, ids, experts: dict) -> bool:
    """Whether routed() runs the fused decode kernels (dsv4.kernels.moe) for these rows."""
    T, k = ids.shape
    alone = rows_per_weight(x) == 1
    if not (alone or (T * k <= experts["w1"].data.shape[0] and not fused_runs(x, experts))):
        return False
    stacks = _stacks(experts)
    return fused_moe.supported(x, stacks, 1 if alone else None) and kernels.use_triton(
        x, gpu_checked=fused_moe.GPU_CHECKED)


def _pairs(x, local, weights, stacks: list[QWeight], limit: float) -> torch.Tensor:
    """sum_j weights[t, j] * expert_{local[t, j]}(x[t]) (local ids valid, weights 0 for other ranks' experts),
    one computation per (token, expert) pair: the selected experts gathered, one batched matmul each."""
    T, k = local.shape
    e = local.flatten()
    if experts_fused(x, stacks):
        # The same SwiGLU on the stored FP8/FP4 bytes of the selected experts (no gather, no dequant).
        h = swiglu_act(expert_linear(x, stacks[0], e, k), expert_linear(x, stacks[1], e, k), limit)
        y = expert_linear(h, stacks[2], e, 1)
    else:
        w1, w3, w2 = (take(stack, e).dequant(x.dtype) for stack in stacks)
        y = swiglu(x.repeat_interleave(k, dim=0).unsqueeze(1), w1, w3, w2, limit)  # rows [T*k, 1, D]
    return (y.view(T, k, -1) * weights.unsqueeze(-1)).sum(dim=1)


def _plus(out: torch.Tensor, shared: torch.Tensor | None) -> torch.Tensor:
    return out if shared is None else out + shared


def _local(ids, weights, first: int, n: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids - first, weights zeroed where the expert is another rank's, in dtype) for experts first..first+n-1."""
    local = ids - first
    mine = (local >= 0) & (local < n)
    return local, torch.where(mine, weights, 0.0).to(dtype)


def moe(x, tokens, w: dict, first: int, cfg: ModelConfig, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, D] (normed collapsed streams), tokens [T] -> partial MoE output [T, D] (in out where the fused
    experts run: see routed)."""
    if "shared" in w and fused_moe.CONFIG["shared_lane"] and _shared_fused(x, w["shared"]):
        return _shared_beside(x, tokens, w, first, cfg, out)
    ids, weights = route(x, tokens, w, cfg)
    if "shared" in w and fused_moe.CONFIG["shared_launch"] and _fused_routed(x, ids, w["experts"]) and \
            _shared_fused(x, w["shared"]) and not _tensor_cores(x, ids, w["experts"]):
        # Both kernel 1s read only x: one launch for the routed rows and the shared expert (the pair kernels').
        e, s = w["experts"], w["shared"]
        groups = fused_moe.groups_for(x, ids, e["w1"], e["w3"])  # a batched step's pairs by expert, or None
        # early: route() launched the router's linear and at least one kernel after x's writer, so x is two or
        # more launches back when kernel 1 starts (dsv4.kernels' contract; groups_for's launch only adds one).
        h, shared_h = fused_moe.routed_and_shared_gate_up(x, ids, e["w1"], e["w3"], first, s["w1"], s["w3"],
                                                          cfg.swiglu_limit, groups, early=True)
        # early: the shared expert's down linear launches between kernel 1 (h's writer) and kernel 2; or, under
        # moe_gl CONFIG down_prefetch (a one-token step), it releases kernel 2 first of all and kernel 2 reads only
        # the ids (route's) before its wait: prefetch, never early
        prefetch = moe_gl.CONFIG["down_prefetch"] and x.shape[0] == 1 and groups is None
        shared = linear(shared_h, s["w2"], release=prefetch)
        return routed(x, ids, weights, e, first, cfg, shared, out, h, groups, early=not prefetch, prefetch=prefetch)
    shared = shared_expert(x, w["shared"], cfg.swiglu_limit) if "shared" in w else None
    return routed(x, ids, weights, w["experts"], first, cfg, shared, out)


def _shared_beside(x, tokens, w: dict, first: int, cfg: ModelConfig, out: torch.Tensor | None) -> torch.Tensor:
    """moe() under dsv4.kernels.moe CONFIG shared_lane: the shared expert's chain (its gate/up launch, its down
    linear) first, on the device's lane in a captured step (dsv4.kernels.lanes), beside the router and the routed
    kernel 1; kernel 2 after the join adds its output. An eager step runs the same launches on one stream in the
    same order, so the bits are the graph's."""
    beside = lanes.use(x.device, True)
    with lanes.beside(x.device, beside):
        shared = shared_expert(x, w["shared"], cfg.swiglu_limit)
    ids, weights = route(x, tokens, w, cfg)
    e, h, groups = w["experts"], None, None
    if _fused_routed(x, ids, e) and not _tensor_cores(x, ids, e):
        groups = fused_moe.groups_for(x, ids, e["w1"], e["w3"])
        h = fused_moe.routed_gate_up(x, ids, e["w1"], e["w3"], first, cfg.swiglu_limit, groups)
    lanes.join(x.device, beside)
    return routed(x, ids, weights, e, first, cfg, shared, out, h, groups)


def shared_expert(x, s: dict, limit: float) -> torch.Tensor:
    """This rank's slice of the shared expert (intermediate rows of w1/w3, columns of w2)."""
    if _shared_fused(x, s):
        h = fused_moe.shared_gate_up(x, s["w1"], s["w3"], limit)  # gate, up and activation in one launch
    elif _shared_tiles(x):
        # CUDA's elementwise kernels give each element the same bits whatever the tensor (session 22 call 3 ran
        # it row by row: 12,096 launches a 16 x 63 wave, 0.43 s; the one-tensor form keeps its digest).
        h = _swiglu(linear(x, s["w1"]), linear(x, s["w3"]), limit)
    else:
        h = swiglu_act(linear(x, s["w1"]), linear(x, s["w3"]), limit)
    return linear(h, s["w2"])


def _shared_tiles(x) -> bool:
    """Whether a short prefill chunk's shared expert takes the v3 tiles (see _shared_fused)."""
    return fused_moe.CONFIG["shared_prefill_tiles"] and step_gemv() == "v3" and x.is_cuda


def _shared_fused(x, s: dict) -> bool:
    """Whether the shared expert's gate/up runs in the fused kernel 1 (dsv4.kernels.moe). With dsv4.kernels.moe
    CONFIG shared_prefill_tiles (on since session 25; DSV4_MOE_SHARED_PREFILL_TILES=0 turns it off) not in a short
    prefill chunk whose GEMVs take the tensor-core tiles (rows.step_gemv "v3"): there its gate and up are two of
    those GEMVs, each row's bits still its own (other bits than the fused kernel's). Session 22 call 2
    (prefill_batch_bench, mini, one H200): in a 16 x 63 grouped wave the fused kernel's CUDA-core products over
    1,008 rows took 28.3 of the wave's 95 ms; session 25 call 1, the wave in one process: 88.4 -> 71.8 ms (58.1
    with moe_tc's wave tiles) (benchmarks/RESULTS.md)."""
    if _shared_tiles(x):
        return False
    return fused_moe.shared_supported(x, s["w1"], s["w3"], rows_per_weight(x)) and kernels.use_triton(
        x, gpu_checked=fused_moe.GPU_CHECKED)
