"""Hybrid attention of one layer (paper 2.3): sliding window + CSA or HCA, shared K=V.

Every layer attends to the last `sliding_window` tokens (a ring of K=V rows).
CSA layers add the indexer's top-k compressed entries (rate 4, overlapping
windows); HCA layers add every compressed entry (rate 128). A learnable sink
logit per head joins the softmax. Partial RoPE: queries and keys rotate their
trailing `qk_rope_head_dim` channels; since V = K, the output's rope slice is
rotated back (-sin) at the query position. The grouped output projection maps
groups of heads to `o_lora_rank` each (wo_a), then mixes them (wo_b).

With TP a rank holds `heads` of the heads (whole output groups); the K=V head,
compressors and indexer are replicated. The output is a partial sum to reduce.

_attend is the attention core and the reference of its fused forms, dsv4.kernels.attention (two
launches for decode chunks of up to 8 tokens, reading the picked rows in place) and
dsv4.kernels.prefill_attention (longer chunks: each query visits only its window and its compressed rows).

attention_pooled: one token of each of B sequences held in one dsv4.state.StatePool (model.step.PoolStep);
its compressors, indexer and attention core run once for all rows, through the kernels' pooled variants
(dsv4.kernels.pooled), and each write it stages holds every row's.
"""

from __future__ import annotations

import torch

from .. import kernels
from ..config import CSA, ModelConfig
from ..kernels import attention as fused
from ..kernels import lanes
from ..kernels import normrope
from ..kernels import prefill_attention as prefill
from ..kernels.compressor import INDEX_BLOCK
from ..profile import phase
from .commit import Undo
from .compressor import (Write, compress, compress_pair, compress_pooled, flat, index_project, index_queries,
                         index_topk, index_topk_pooled, project)
from .linear import grouped_linear, linear
from .norm import rms_norm, unweighted_rms_norm
from .rope import apply_rope
from .step import PoolStep, Step
from ..layout import CONFIG as LAYOUT

# The arrangement switches fuse_qkv and fuse_xproj live in dsv4.layout (the records name them); this is the same dict.
CONFIG = LAYOUT
# The bf16 linears of x that fuse_xproj stacks, in the stacked weight's order: (attention dict, weight). The indexer's
# weights_proj last: its few rows (Flash: 64) leave the wider parts' column views 16-byte aligned.
X_PROJ = (("compressor", "wkv"), ("compressor", "wgate"), ("indexer", "wkv"), ("indexer", "wgate"),
          ("indexer", "weights_proj"))


def attention(x, steps: list[Step], w: dict, caches: list, layer: int, cfg: ModelConfig, heads: int,
              writes: list[Write], out: torch.Tensor | None = None, undo: Undo | None = None) -> torch.Tensor:
    """x [B*T, D] (normed collapsed streams of B sequences, T tokens each, sequence-major) -> partial
    attention output [B*T, D]. Projections run over every row at once; each sequence then attends
    over its own caches (`caches[b]`, geometry `steps[b]`, whose keep masks its staged writes carry).
    out: where the output projection's fused kernel writes it, when it runs (see _output).
    undo: a verify step's (dsv4.speculative): the rows are one sequence's successive positions (see _in_turn)."""
    if undo is not None:
        if CONFIG["verify_chunk"] and _chunked(x, steps):
            return _in_chunk(x, steps, w, caches, layer, cfg, heads, undo, out)
        return _in_turn(x, steps, w, caches, layer, cfg, heads, undo, out)
    B, T = len(steps), steps[0].T
    m = cfg.compress_rate(layer)
    kind = "compress" if m else "main"
    cos, sin = _rows([s.cos_sin(kind) for s in steps])
    beside, x_lane, x_out = _lanes_and_x_proj(x, w, m)
    if m:  # the windows' geometry before q's latent: see _pool_early
        for step, cache in zip(steps, caches):
            step.windows(m, cache.ckv.shape[0], cache.comp.shape[0])
    q_res, kv_a, roped = _q_res_kv(x, w, cfg, cos, sin)
    extras, staged = [{} for _ in steps], [[] for _ in steps]  # each sequence's compressed rows and their writes
    if m:
        with phase("compressor"), lanes.beside(x.device, beside):
            proj = _project(x, q_res, w, cfg, x_out)
            for b, (step, cache) in enumerate(zip(steps, caches)):
                rows = slice(b * T, (b + 1) * T)
                extras[b] = _compressed(x[rows], q_res[rows], step, w, cache, layer, cfg, staged[b],
                                        {k: tuple(t[rows] for t in v) for k, v in proj.items()},
                                        _pool_early(x_out, w, x_lane))
    q, kv = _queries(q_res, kv_a, roped, w, cfg, heads, cos, sin)
    lanes.join(x.device, beside)

    outs = []
    for b, (step, cache) in enumerate(zip(steps, caches)):
        rows = slice(b * T, (b + 1) * T)
        visible, slots = step.sliding()
        writes.append(Write(cache.win, slots, kv[rows][T - min(T, cfg.sliding_window):], step.keep(slots.shape[0])))
        writes.extend(staged[b])
        extra = extras[b]
        cos_b, sin_b = step.cos_sin(kind)
        args = (q[rows], cache.win, kv[rows], visible, w["attn_sink"], cos_b, sin_b)
        if kernels.use_triton(q, gpu_checked=fused.GPU_CHECKED) and fused.supported(*args, **extra):
            outs.append(fused.attention(*args, **extra))
        elif kernels.use_triton(q, gpu_checked=prefill.GPU_CHECKED) and prefill.supported(*args, **extra):
            outs.append(prefill.attention(*args, **_scored(extra, step, m)))  # chunks past the decode kernel's MAX_T
        else:
            outs.append(_attend(*args, **extra))
    return _output(outs[0] if B == 1 else torch.cat(outs), w, cfg, heads, out)


def _row_attention(q, kv, step: Step, cache, w: dict, extra: dict, kind: str) -> tuple[torch.Tensor, Write]:
    """One decode row's attention core over its caches (the decode kernel, or the reference) and its window write:
    attention's per-sequence loop for T == 1. (Kept apart from that loop, which runs on the GPU by default, until
    a GPU run covers the verify step; then the loop can call it.)"""
    visible, slots = step.sliding()
    write = Write(cache.win, slots, kv, step.keep(slots.shape[0]))
    cos_b, sin_b = step.cos_sin(kind)
    args = (q, cache.win, kv, visible, w["attn_sink"], cos_b, sin_b)
    if kernels.use_triton(q, gpu_checked=fused.GPU_CHECKED) and fused.supported(*args, **extra):
        return fused.attention(*args, **extra), write
    return _attend(*args, **extra), write


def _in_turn(x, steps: list[Step], w: dict, caches: list, layer: int, cfg: ModelConfig, heads: int, undo: Undo,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """A verify step's attention (dsv4.speculative): row b is one sequence's token at pos + b, each row a decode
    step of its own (steps[b].T == 1). The projections run over every row at once (rows alone: each row's bits are
    its solo step's); then each row in turn runs its compressor, indexer and attention over the caches and applies
    its writes (undo: kept to take back), so row b sees rows 0..b-1 exactly as the decode step at pos + b sees
    them, committed. No lanes and no early pools: a row's pools read what the row before it just wrote."""
    m = cfg.compress_rate(layer)
    kind = "compress" if m else "main"
    cos, sin = _rows([s.cos_sin(kind) for s in steps])
    x_out = _x_proj_first(x, w, m)
    if m:
        for step, cache in zip(steps, caches):
            step.windows(m, cache.ckv.shape[0], cache.comp.shape[0])
    q_res, kv_a, roped = _q_res_kv(x, w, cfg, cos, sin)
    proj = None
    if m:
        with phase("compressor"):
            proj = _project(x, q_res, w, cfg, x_out)
    q, kv = _queries(q_res, kv_a, roped, w, cfg, heads, cos, sin)
    outs = []
    for b, (step, cache) in enumerate(zip(steps, caches)):
        rows = slice(b, b + 1)
        staged, extra = [], {}
        if m:
            with phase("compressor"):
                extra = _compressed(x[rows], q_res[rows], step, w, cache, layer, cfg, staged,
                                    {k: tuple(t[rows] for t in v) for k, v in proj.items()}, False)
        o, window = _row_attention(q[rows], kv[rows], step, cache, w, extra, kind)
        outs.append(o)
        undo.apply([window, *staged], b)
    return _output(torch.cat(outs), w, cfg, heads, out)


def _chunked(x, steps: list[Step]) -> bool:
    """Whether a verify step's rows run as one chunk (_in_chunk): its kernels run (each row's bits then those of
    the rows in turn, which the torch reference does not promise), and the rows fit the decode kernels' chunk. One row
    (the MTP layer's drafting steps) runs as a decode step: the same launches without the chunk's geometry."""
    return (kernels.use_triton(x, gpu_checked=fused.GPU_CHECKED) and 1 < len(steps) <= fused.MAX_T
            and all(s.T == 1 for s in steps))


def _in_chunk(x, steps: list[Step], w: dict, caches: list, layer: int, cfg: ModelConfig, heads: int, undo: Undo,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """_in_turn's rows as one chunk (layout CONFIG verify_chunk): the same bits, a layer's launches whatever the rows.
    Row t is the decode step at pos + t once rows 0..t-1 are committed. A compressed window's entry and an index key
    are the same whoever computes them, from the ring or from the chunk (the same slots in the same order, the same
    kernel), so the compressors and the indexer run once over the rows as a chunk (step.VerifyRows.chunk): each row's
    top-k the decode step's picks (the same keys; the windows this step closes sort after the committed rows in
    both index spaces, as in the store), cut to the decode step's K. The attention's kernel then runs every row as
    its decode step (each row's masks and rope from VerifyRows.each), reading the ring rows and store rows its
    earlier rows wrote from the chunk (dsv4.kernels.attention's verify). Nothing is written before every row has
    read: the writes are applied last, in one Undo application, each index tagged with its row (the take-back
    keeps the rows accepted). Where the kernel does not take a layer's shapes, that layer's rows run in turn."""
    rows = steps[0].verify_rows(len(steps))
    each, cache = rows.each, caches[0]  # one sequence: every row's caches are the same buffers
    m = cfg.compress_rate(layer)
    cos, sin = each.cos_sin("compress" if m else "main")
    x_out = _x_proj_first(x, w, m)
    q_res, kv_a, roped = _q_res_kv(x, w, cfg, cos, sin)
    staged, extra = [], {}
    if m:
        with phase("compressor"):
            extra = _compressed(x, q_res, rows.chunk, w, cache, layer, cfg, staged,
                                _project(x, q_res, w, cfg, x_out), False)
        if "sel" in extra:  # the decode step's K: its index space holds one new window
            K = min(cfg.index_topk, cache.icomp.shape[0] + 1)
            extra.update(sel=extra["sel"][:, :K], valid=extra["valid"][:, :K])
        else:
            mine = each.windows(m, cache.ckv.shape[-2], cache.comp.shape[-2])
            extra.update(committed=mine.committed, new_visible=mine.visible)
    q, kv = _queries(q_res, kv_a, roped, w, cfg, heads, cos, sin)
    visible, slots = each.sliding()
    args = (q, cache.win, kv, visible, w["attn_sink"], cos, sin)
    if not fused.supported(*args, **extra, verify=each.positions, rate=m):  # nothing of this layer written yet
        return _in_turn(x, steps, w, caches, layer, cfg, heads, undo, out)
    o = fused.attention(*args, **extra, verify=each.positions, rate=m)
    tags = [rows.order]
    if m:
        win = rows.chunk.windows(m, cache.ckv.shape[0], cache.comp.shape[0])
        tags += [rows.closers(m, win) if s.index is win.store_index else rows.order for s in staged]
    undo.apply([Write(cache.win, slots, kv), *staged], tags)
    return _output(o, w, cfg, heads, out)


def attention_pooled(x, step: PoolStep, w: dict, cache, layer: int, cfg: ModelConfig, heads: int,
                     writes: list[Write], out: torch.Tensor | None = None) -> torch.Tensor:
    """`attention` for one token of each of B pooled sequences: x [B, D]; `cache` the pool's stacked
    LayerCache of this layer. Every row's arithmetic is that of the same row stepped alone."""
    m = cfg.compress_rate(layer)
    cos, sin = step.cos_sin("compress" if m else "main")
    beside, x_lane, x_out = _lanes_and_x_proj(x, w, m)
    if m:  # the windows' geometry before q's latent: see _pool_early
        step.windows(m, cache.ckv.shape[-2], cache.comp.shape[-2])
    q_res, kv_a, roped = _q_res_kv(x, w, cfg, cos, sin)
    extra, staged = {}, []
    if m:
        with phase("compressor"), lanes.beside(x.device, beside):
            extra = _compressed_pooled(step, w, cache, layer, cfg, staged, _project(x, q_res, w, cfg, x_out),
                                       _pool_early(x_out, w, x_lane))
    q, kv = _queries(q_res, kv_a, roped, w, cfg, heads, cos, sin)
    lanes.join(x.device, beside)
    visible, slots = step.sliding()
    writes.append(Write(flat(cache.win), slots, kv, step.keep()))
    writes.extend(staged)
    args = (q, cache.win, kv, visible, w["attn_sink"], cos, sin)
    if not fused.supported(*args, **extra, ids=step.ids):
        raise RuntimeError(f"layer {layer}: the pooled attention kernel does not take these shapes/dtypes")
    return _output(fused.attention(*args, **extra, ids=step.ids), w, cfg, heads, out)


def _pool_early(x_out, w: dict, x_on_lane: bool = False) -> bool:
    """Whether a compressed layer's pools may run before their PDL wait and its index keys load all but the new keys
    before theirs (dsv4.kernels.compressor's early): the windows' geometry is made before q's latent (the callers'
    order), and the pools' rows two or more kernels back: the stacked x linear launched first (x_out), or a CSA layer,
    whose indexer's query projection runs after every x linear; the index keys follow the pool. x_on_lane: the
    stacked linear ran on the lane (layout CONFIG lane_xproj), where an HCA layer's pool is the next kernel after it."""
    return "indexer" in w or (x_out is not None and not x_on_lane)


def _lanes_and_x_proj(x, w: dict, m: int) -> tuple[bool, bool, torch.Tensor | None]:
    """(beside: a compressed layer's compressor and indexer run on the lane (dsv4.kernels.lanes, layout CONFIG lane),
    x_lane: the stacked x linear does too (CONFIG lane_xproj), its output where _x_proj_first ran it)."""
    beside = bool(m) and lanes.use(x.device, CONFIG["lane"])
    x_lane = beside and CONFIG["lane_xproj"]
    with lanes.beside(x.device, x_lane):
        return beside, x_lane, _x_proj_first(x, w, m)


def _x_proj_first(x, w: dict, m: int) -> torch.Tensor | None:
    """The stacked linear of x (fuse_xproj) launched before the query chain (CONFIG xproj_first), else None (it runs
    in _project, after q's and kv's norms). It reads x alone, so where it runs changes no value: launched right after
    the mHC boundary, its first weight tiles load while the boundary runs (DSV4_PDL), not while a short norm does."""
    if m and CONFIG["xproj_first"] and "x_proj" in w:
        with phase("compressor"):
            return linear(x, w["x_proj"])
    return None


def _q_res_kv(x, w: dict, cfg: ModelConfig, cos, sin):
    """(q_res, kv, roped): the normed query latent and the K=V projection, row-wise; kv normed and roped already
    (roped) where both norms run in one launch (CONFIG pair_norms: kernels.normrope.q_kv_norms)."""
    q_a, kv_a = _q_a_kv(x, w)
    eps = cfg.rms_norm_eps
    if (CONFIG["pair_norms"] and kernels.use_triton(q_a, gpu_checked=normrope.GPU_CHECKED)
            and normrope.q_kv_supported(q_a, w["q_norm"], kv_a, w["kv_norm"], cos, sin)):
        return (*normrope.q_kv_norms(q_a, w["q_norm"], kv_a, w["kv_norm"], eps, cos, sin), True)
    return rms_norm(q_a, w["q_norm"], eps), kv_a, False


def _queries(q_res, kv_a, roped: bool, w: dict, cfg: ModelConfig, heads: int, cos, sin):
    """(roped queries [rows, heads, hd], roped K=V rows): row-wise (kv_a as it is where _q_res_kv roped it)."""
    eps = cfg.rms_norm_eps
    q = _norm_rope(linear(q_res, w["wq_b"]).view(q_res.shape[0], heads, cfg.head_dim), None, eps, cos, sin)
    return q, kv_a if roped else _norm_rope(kv_a, w["kv_norm"], eps, cos, sin)


def _q_a_kv(x, w: dict):
    """x's wq_a and wkv projections; one linear over their stacked rows where the load made it (CONFIG fuse_qkv),
    split into column views (the norm kernels read their strided rows in place)."""
    if "wq_a_wkv" not in w:
        return linear(x, w["wq_a"]), linear(x, w["wkv"])
    return linear(x, w["wq_a_wkv"]).split([w["wq_a"].shape[0], w["wkv"].shape[0]], dim=-1)


def _output(heads_out, w: dict, cfg: ModelConfig, heads: int, out: torch.Tensor | None = None):
    """The grouped output projection of the heads' outputs [rows, heads, hd]; wo_b's GEMV writes into out
    [rows, D] where its kernel runs (the door's payload: dsv4.parallel.Comm.payload), else a new tensor."""
    groups = cfg.o_groups * heads // cfg.num_attention_heads
    return linear(grouped_linear(heads_out.reshape(heads_out.shape[0], -1), w["wo_a"], groups), w["wo_b"], out)


def _norm_rope(x, weight, eps, cos, sin):
    """RoPE of RMSNorm(x) (weighted; or, with no weight, q's per-head norm): one launch with the fused kernel."""
    if kernels.use_triton(x, gpu_checked=normrope.GPU_CHECKED) and normrope.supported(x, weight, cos, sin):
        return normrope.norm_rope(x, weight, eps, cos, sin)
    return apply_rope(unweighted_rms_norm(x, eps) if weight is None else rms_norm(x, weight, eps), cos, sin)


def _rows(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Every sequence's (cos, sin) rows, stacked sequence-major (one sequence: its own, uncopied)."""
    if len(parts) == 1:
        return parts[0]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def _project(x, q_res, w: dict, cfg: ModelConfig, x_out: torch.Tensor | None = None) -> dict:
    """The compressors' and the indexer's projections of every row (row-wise, so once for all sequences); x_out: the
    stacked linear's output where _x_proj_first ran it."""
    if "x_proj" in w:
        return _project_stacked(x, q_res, w, cfg, x_out)
    proj = {"compressor": project(x, w["compressor"])}
    if "indexer" in w:
        proj["indexer"] = project(x, w["indexer"])
        proj["index_q"] = index_project(q_res, x, w["indexer"], cfg.index_n_heads, cfg.index_head_dim)
    return proj


def _project_stacked(x, q_res, w: dict, cfg: ModelConfig, x_out: torch.Tensor | None = None) -> dict:
    """_project with x's linears in one over the weight the load stacked (CONFIG fuse_xproj), split into column views
    (strided rows: the compressor's pool, the index keys and the commit read them in place)."""
    parts = [key for key in X_PROJ if key[0] in w]
    out = linear(x, w["x_proj"]) if x_out is None else x_out
    y = dict(zip(parts, out.split([w[owner][name].shape[0] for owner, name in parts], dim=-1)))
    proj = {"compressor": (y["compressor", "wkv"], y["compressor", "wgate"])}
    if "indexer" in w:
        proj["indexer"] = (y["indexer", "wkv"], y["indexer", "wgate"])
        proj["index_q"] = (index_queries(q_res, w["indexer"], cfg.index_n_heads, cfg.index_head_dim),
                           y["indexer", "weights_proj"])
    return proj


def _compressed(x, q_res, step: Step, w: dict, cache, layer: int, cfg: ModelConfig, writes: list[Write],
                proj: dict, early: bool = False) -> dict:
    """The compressed rows this layer's queries see: the compressor's entries and, for CSA, the indexer's picks
    (early: _pool_early's)."""
    m, eps = cfg.compress_rate(layer), cfg.rms_norm_eps
    csa = cfg.layer_types[layer] == CSA
    win = step.windows(m, cache.ckv.shape[0], cache.comp.shape[0])
    if not csa:
        new = compress(x, w["compressor"], cache.ckv, cache.cgate, cache.comp, win, csa, eps, writes,
                       proj["compressor"], early)
        return dict(comp=cache.comp, new=new, committed=win.committed, new_visible=win.visible)
    i = w["indexer"]
    with phase("indexer"):
        new, inew = compress_pair((w["compressor"], cache.ckv, cache.cgate, cache.comp, proj["compressor"]),
                                  (i, cache.ikv, cache.igate, cache.icomp, proj["indexer"]), win, eps, writes,
                                  early=early)
        ccos, csin = step.cos_sin("compress")
        rows = cache.icomp.shape[0]
        prefix = None if step.host_pos is None else (step.scored_rows(m, rows, INDEX_BLOCK),
                                                     step.committed_rows(m, rows))
        sel, valid = index_topk(q_res, x, ccos, csin, i, cache.icomp, inew, win, cfg.index_topk,
                                cfg.index_n_heads, cfg.index_head_dim, proj["index_q"], prefix, early)
    return dict(comp=cache.comp, new=new, sel=sel, valid=valid)


def _scored(extra: dict, step: Step, m: int) -> dict:
    """HCA's rows for the prefill kernel cut to the prefix step.scored_rows keeps: the rows cut off are
    uncommitted (masked), and the kernel's tiles of the rows it still sees are the same, so is its output."""
    if "committed" not in extra or step.host_pos is None:
        return extra
    n = step.scored_rows(m, extra["comp"].shape[0], prefill.CONFIG["block_n"])
    return dict(extra, comp=extra["comp"][:n], committed=extra["committed"][:n])


def _compressed_pooled(step: PoolStep, w: dict, cache, layer: int, cfg: ModelConfig, writes: list[Write],
                       proj: dict, early: bool = False) -> dict:
    """_compressed for pooled rows: each row's one window, its new entry new[b] [1, hd]."""
    m, eps = cfg.compress_rate(layer), cfg.rms_norm_eps
    csa = cfg.layer_types[layer] == CSA
    win = step.windows(m, cache.ckv.shape[-2], cache.comp.shape[-2])
    if not csa:
        new = compress_pooled(w["compressor"], cache.ckv, cache.cgate, cache.comp, win, csa, eps, writes,
                              proj["compressor"], step.ids, early).unsqueeze(1)
        return dict(comp=cache.comp, new=new, committed=win.committed, new_visible=win.visible)
    i = w["indexer"]
    with phase("indexer"):
        new, inew = compress_pair((w["compressor"], cache.ckv, cache.cgate, cache.comp, proj["compressor"]),
                                  (i, cache.ikv, cache.igate, cache.icomp, proj["indexer"]), win, eps, writes,
                                  step.ids, early)
        new = new.unsqueeze(1)
        ccos, csin = step.cos_sin("compress")
        sel, valid = index_topk_pooled(ccos, csin, cache.icomp, inew.unsqueeze(1), win, cfg.index_topk,
                                       proj["index_q"], step.ids, early)
    return dict(comp=cache.comp, new=new, sel=sel, valid=valid)


def _attend(q, win, kv, visible, sink, cos, sin, comp=None, new=None, sel=None, valid=None, committed=None,
            new_visible=None) -> torch.Tensor:
    """Queries q [T, heads, hd] over the sliding window [win; kv] (masked by visible [T, W + T]) and the
    compressed rows: CSA's picks sel [T, K] into [comp | new] (masked by valid), or HCA's every row of
    comp (masked by committed) and new (masked by new_visible [T, n_win]). Sink, softmax, the output's
    rope slice rotated back."""
    T, heads, hd = q.shape
    keys = torch.cat([win, kv])
    scale = hd ** -0.5
    logits = [torch.einsum("thd,kd->thk", q, keys).mul(scale).masked_fill(~visible.unsqueeze(1), float("-inf"))]
    values = [keys]
    if sel is not None:
        ns = comp.shape[0]
        from_new = sel >= ns
        picked = torch.where(from_new.unsqueeze(-1), new[(sel - ns).clamp(0, new.shape[0] - 1)],
                             comp[sel.clamp(max=ns - 1)])  # [T, K, hd]
        logits.append(torch.einsum("thd,tkd->thk", q, picked).mul(scale)
                      .masked_fill(~valid.unsqueeze(1), float("-inf")))
        values.append(picked)
    elif comp is not None:
        for rows, vis in ((comp, committed.expand(T, -1)), (new, new_visible)):
            logits.append(torch.einsum("thd,kd->thk", q, rows).mul(scale)
                          .masked_fill(~vis.unsqueeze(1), float("-inf")))
            values.append(rows)

    sink = sink.to(q.dtype).view(1, heads, 1).expand(T, heads, 1)
    joint = torch.cat(logits + [sink], dim=-1)
    probs = torch.softmax(joint - joint.amax(dim=-1, keepdim=True), dim=-1)
    out, start = None, 0
    for lg, v in zip(logits, values):
        p = probs[..., start:start + lg.shape[-1]]
        start += lg.shape[-1]
        o = torch.einsum("thk,kd->thd", p, v) if v.dim() == 2 else torch.einsum("thk,tkd->thd", p, v)
        out = o if out is None else out + o
    return apply_rope(out, cos, sin, inverse=True)
