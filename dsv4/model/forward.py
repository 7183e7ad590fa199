"""The forward and the step transaction: forward -> verdict -> commit -> head.

One forward serves prefill chunks and one-token decode, eager or captured in a
CUDA graph, on one rank or many. It reads the DecodeState and stages every
write (`Write`); the commit applies them only where the step's verdict is 0 (no
collective refused), on device, with masked copies. No `.item()`, no host
branch on device values, no shape that depends on data.
"""

from __future__ import annotations

import torch

from .. import kernels
from ..config import HASH_MOE, ModelConfig
from ..formats import QWeight, stack_rows
from ..kernels import bookkeeping
from ..kernels import hc_boundary as fused_boundary
from ..kernels import pooled
from ..layout import CONFIG as LAYOUT, check_split, expert_range
from ..parallel import Comm
from ..profile import phase
from ..state import DecodeState, StatePool, pool_of
from . import attention as attention_module
from .attention import attention, attention_pooled
from .commit import Undo, Write, commit
from .hc import hc_head, hc_post, hc_pre
from .linear import linear
from .rows import dense, rows_alone, short_chunk
from .moe import moe
from .norm import rms_norm
from .rope import Rope
from .step import PoolStep, Step


def _stack(ws: list[QWeight]) -> QWeight:
    """One [experts, ...] weight from per-expert ones; reuses their common stack when they are its rows."""
    first = ws[0]

    def stacked(parts):
        base = parts[0]._base
        if base is not None and base.shape == (len(parts), *parts[0].shape) and base.dtype == parts[0].dtype and all(
                p._base is base and p.data_ptr() == base[i].data_ptr() for i, p in enumerate(parts)):
            return base
        return torch.stack(parts)

    scale = None if first.scale is None else stacked([w.scale for w in ws])
    return QWeight(stacked([w.data for w in ws]), scale, first.fmt, first.row0, first.col0)


# The official names of attention.X_PROJ's weights (the oracle and the checkpoint code read them by these).
_X_PROJ_NAMES = {("compressor", "wkv"): "attn.compressor.wkv.weight",
                 ("compressor", "wgate"): "attn.compressor.wgate.weight",
                 ("indexer", "wkv"): "attn.indexer.compressor.wkv.weight",
                 ("indexer", "wgate"): "attn.indexer.compressor.wgate.weight",
                 ("indexer", "weights_proj"): "attn.indexer.weights_proj.weight"}


class Transformer:
    """A rank's weights arranged for the forward, and the step transaction."""

    def __init__(self, cfg: ModelConfig, weights: dict, comm: Comm, device, dtype):
        check_split(cfg, comm.world)
        self.cfg, self.comm, self.device, self.dtype = cfg, comm, torch.device(device), dtype
        self.heads = cfg.num_attention_heads // comm.world
        self.experts = expert_range(cfg, comm.rank, comm.world)
        self.rope = Rope(cfg, self.device)
        self.embed = weights["embed.weight"]
        self.head_w = weights["head.weight"]
        self.norm = weights["norm.weight"]
        self.hc_head = (weights["hc_head_fn"], weights["hc_head_base"], weights["hc_head_scale"])
        self.layers = [self._layer(weights, i) for i in range(cfg.num_hidden_layers)]
        # The MTP layers, where the weights hold them (dsv4.load(mtp=True)): speculative decoding's drafter (mtp_rows)
        self.mtp = [self._mtp_layer(weights, j) for j in range(cfg.num_nextn_predict_layers)
                    if f"mtp.{j}.enorm.weight" in weights]
        self.weights = weights  # by official name (experts now live stacked in self.layers)
        self.trace = None  # a Counter while a graph is being captured (see dsv4.replay)

    def flat_weights(self) -> dict:
        return self.weights

    def _mtp_layer(self, wt: dict, j: int) -> dict:
        """MTP layer j (`mtp.J.`): a decoder layer at index num_hidden_layers + j and what joins it to the main model."""
        p = f"mtp.{j}."
        layer = self._layer(wt, self.cfg.num_hidden_layers + j, p)
        layer.update({k: wt[p + k + ".weight"] for k in ("enorm", "hnorm", "e_proj", "h_proj", "norm")},
                     hc_head=(wt[p + "hc_head_fn"], wt[p + "hc_head_base"], wt[p + "hc_head_scale"]))
        return layer

    def _layer(self, wt: dict, i: int, p: str | None = None) -> dict:
        p, cfg = p or f"layers.{i}.", self.cfg
        get = lambda name: wt[p + name]  # noqa: E731
        attn = {k: get("attn." + k + ".weight") for k in ("wq_a", "q_norm", "wq_b", "wkv", "kv_norm", "wo_a", "wo_b")}
        attn["attn_sink"] = get("attn.attn_sink")
        if attention_module.CONFIG["fuse_qkv"]:
            self._fuse_qkv(wt, p, attn)
        if cfg.compress_rate(i):
            attn["compressor"] = self._compressor(wt, p + "attn.compressor.")
            if p + "attn.indexer.wq_b.weight" in wt:
                attn["indexer"] = self._compressor(wt, p + "attn.indexer.compressor.")
                attn["indexer"]["wq_b"] = get("attn.indexer.wq_b.weight")
                attn["indexer"]["weights_proj"] = get("attn.indexer.weights_proj.weight")
            if attention_module.CONFIG["fuse_xproj"]:
                self._fuse_xproj(wt, p, attn)
        ffn = {"gate": get("ffn.gate.weight")}
        if i < cfg.num_hidden_layers and cfg.mlp_layer_types[i] == HASH_MOE:  # an MTP layer routes by score
            ffn["tid2eid"] = get("ffn.gate.tid2eid")
        else:
            ffn["bias"] = get("ffn.gate.bias")
        ffn["experts"] = {n: _stack([wt.pop(p + f"ffn.experts.{e}.{n}.weight") for e in self.experts])
                          for n in ("w1", "w3", "w2")}
        if cfg.n_shared_experts:
            ffn["shared"] = {n: get(f"ffn.shared_experts.{n}.weight") for n in ("w1", "w3", "w2")}
        hc = {site: (get(f"hc_{site}_fn"), get(f"hc_{site}_base"), get(f"hc_{site}_scale"))
              for site in ("attn", "ffn")}
        return {"attn": attn, "ffn": ffn, "hc": hc, "attn_norm": get("attn_norm.weight"),
                "ffn_norm": get("ffn_norm.weight")}

    @staticmethod
    def _fuse_qkv(wt: dict, p: str, attn: dict):
        """wq_a and wkv stacked into attn["wq_a_wkv"] (one launch for both) where their formats allow; their official
        names then hold views of it, so the oracle and the checkpoint code still find them and nothing is held twice."""
        stacked = stack_rows([attn["wq_a"], attn["wkv"]])
        if stacked is None:
            return
        attn["wq_a_wkv"], (attn["wq_a"], attn["wkv"]) = stacked
        wt[p + "attn.wq_a.weight"], wt[p + "attn.wkv.weight"] = attn["wq_a"], attn["wkv"]

    @staticmethod
    def _fuse_xproj(wt: dict, p: str, attn: dict):
        """The compressed layer's bf16 linears of x (attention.X_PROJ's order) stacked into attn["x_proj"] (one launch
        for all), their official names and places holding views of it, as _fuse_qkv does."""
        parts = [key for key in attention_module.X_PROJ if key[0] in attn]
        stacked = stack_rows([attn[owner][name] for owner, name in parts])
        if stacked is None:
            return
        attn["x_proj"], views = stacked
        for (owner, name), view in zip(parts, views):
            attn[owner][name] = wt[p + _X_PROJ_NAMES[owner, name]] = view

    @staticmethod
    def _compressor(wt: dict, p: str) -> dict:
        return {"wkv": wt[p + "wkv.weight"], "wgate": wt[p + "wgate.weight"], "ape": wt[p + "ape"],
                "norm": wt[p + "norm.weight"]}

    # ---- the math ----------------------------------------------------------
    def forward(self, states: list[DecodeState], tokens: torch.Tensor, active: torch.Tensor | None = None,
                by_position: bool = True, undo: Undo | None = None) -> tuple[list[Write], torch.Tensor]:
        """tokens [B*T]: T tokens for each of the B states (sequence-major), each at its own position
        state.pos.. -> (staged writes, final streams [B*T, hc, D]). Everything but attention runs
        over all rows at once; in a decode step or a short prefill chunk (rows.short_chunk) each row
        comes out as it would alone (rows_alone), so a sequence's step does not depend on the others in it.
        by_position=False: no shape follows the host's position (model.step.Step's host_pos not given), as a
        captured prefill chunk needs (dsv4.replay.PrefillReplay); the same bits either way.
        undo: a verify step's (see verify): its writes applied row by row, none staged."""
        cfg = self.cfg
        B = len(states)
        T = tokens.shape[0] // B
        pool = None if undo is not None else self._pooled(states, T)
        if pool is not None:  # one launch per kernel for every row (attention_pooled)
            ids = pool.index(states)
            step = PoolStep(pool.store.pos.index_select(0, ids), ids, self.rope, cfg.sliding_window, active)
            attend = lambda x, w, i, writes, out: attention_pooled(  # noqa: E731
                x, step, w, pool.store.layers[i], i, cfg, self.heads, writes, out)
        else:
            steps = [Step(s.pos, T, self.rope, cfg.sliding_window, None if active is None else active[b],
                          s.host_pos if by_position else None) for b, s in enumerate(states)]
            attend = lambda x, w, i, writes, out: attention(  # noqa: E731
                x, steps, w, [s.layers[i] for s in states], i, cfg, self.heads, writes, out, undo)
        self._count("embedding")
        writes: list[Write] = []
        alone = short_chunk(T)
        comm = self.comm
        with rows_alone(alone, T):
            h, post, comb, x = self._first_boundary(tokens, alone)
            for i, L in enumerate(self.layers):
                with phase("attention"):
                    a = attend(x, L["attn"], i, writes, comm.payload(i, "attention", x.dtype))
                h, post, comb, x = self._boundary(self._reduce(a, i, "attention"), post, comb, h, L, "ffn", alone,
                                                  (i, "moe"))
                with phase("moe"):
                    f = moe(x, tokens, L["ffn"], self.experts.start, cfg, comm.payload(i, "moe", x.dtype))
                after = self.layers[i + 1] if i + 1 < len(self.layers) else None  # the head collapses after the commit
                h, post, comb, x = self._boundary(self._reduce(f, i, "moe"), post, comb, h, after, "attn", alone,
                                                  (i + 1, "attention"))
        return writes, h

    @staticmethod
    def _pooled(states: list[DecodeState], T: int) -> StatePool | None:
        """The pool of a one-token step whose states all live in it, when its pooled kernels run (see
        dsv4.kernels.pooled); else None: each sequence attends on its own (its state's views, if pooled)."""
        pool = pool_of(states) if T == 1 else None
        if pool is None or not kernels.use_triton(pool.store.pos, gpu_checked=pooled.GPU_CHECKED):
            return None
        return pool

    def _reduce(self, x, layer: int, site: str):
        with phase("collective"):
            return self.comm.all_reduce(x, layer, site)

    def _count(self, what: str, n: int = 1):
        if self.trace is not None:
            self.trace[what] += n

    def _fused(self, rows: torch.Tensor, L: dict | None, site: str, alone: bool) -> bool:
        """Whether the boundary before L's sublayer `site` runs in one launch (dsv4.kernels.hc_boundary) on rows
        (the streams [T, hc, D], or the embedded rows [T, D] of the first boundary)."""
        return (L is not None and alone and kernels.use_triton(rows, gpu_checked=fused_boundary.GPU_CHECKED)
                and fused_boundary.supported(rows, self.cfg.hc_mult, L["hc"][site][0], L[site + "_norm"]))

    def _first_boundary(self, tokens: torch.Tensor, alone: bool):
        """The embedded rows of `tokens` copied into every stream, then layer 0's attention maps and normed input
        (_boundary with h None). Where that boundary runs in one launch on the table's own dtype, the kernel reads
        each token's row from the embedding table itself (bookkeeping.CONFIG "lean_prologue"): no gather launch
        before it, the same values."""
        cfg, L = self.cfg, self.layers[0]
        rows = torch.empty(tokens.shape[0], cfg.hidden_size, dtype=self.dtype, device=tokens.device)  # no launch
        lean = bookkeeping.CONFIG["lean_prologue"] and self.embed.dtype == self.dtype
        if lean and self._fused(rows, L, "attn", alone):
            with phase("mhc"):
                return fused_boundary.boundary(self.embed, None, None, None, *L["hc"]["attn"], L["attn_norm"],
                                               cfg.hc_mult, cfg.hc_sinkhorn_iters, cfg.rms_norm_eps, cfg.hc_eps,
                                               self.comm.open_door(0, "attention", rows), ids=tokens)
        x = self.embed.index_select(0, tokens).to(self.dtype)  # a decode step's gather: ~2 us where [tokens] took ~5
        return self._boundary(x, None, None, None, L, "attn", alone, (0, "attention"))

    def _boundary(self, out, post, comb, h, L: dict | None, site: str, alone: bool, door: tuple[int, str]):
        """An mHC boundary (paper 2.2): the sublayer's output `out` into the streams h by post and comb (h None:
        out is the embedded row, copied into every stream), then the maps of L's sublayer `site` and its
        normed input -> (streams, post, comb, x); L None (after the last layer): the streams alone.
        Rows alone (a decode step, a short chunk) run it in one launch (dsv4.kernels.hc_boundary: per row),
        which opens `door` (layer, site), the all-reduce after that sublayer, where Comm.open_door does."""
        cfg = self.cfg
        if h is not None:
            self._count("collective")
            self._count("hc_post")
        if self._fused(out if h is None else h, L, site, alone):
            with phase("mhc"):
                return fused_boundary.boundary(out, post, comb, h, *L["hc"][site], L[site + "_norm"], cfg.hc_mult,
                                               cfg.hc_sinkhorn_iters, cfg.rms_norm_eps, cfg.hc_eps,
                                               self.comm.open_door(*door, out))
        with phase("mhc"):
            if h is None:
                h = out.unsqueeze(1).expand(out.shape[0], cfg.hc_mult, cfg.hidden_size).contiguous()
            else:
                h = hc_post(out, post, comb, h)
            if L is None:
                return h, None, None, None
            post, comb, collapsed = hc_pre(h, *L["hc"][site], cfg)
            return h, post, comb, rms_norm(collapsed, L[site + "_norm"], cfg.rms_norm_eps)

    def head(self, h: torch.Tensor, hc: tuple | None = None, norm: torch.Tensor | None = None) -> torch.Tensor:
        """Streams [B, hc, D] of each sequence's last token -> logits [B, vocab] in the head's dtype (vocab-parallel,
        gathered); each row as it would be alone. The states hold them in fp32: settle widens them as it stores them
        (exact), so no launch of its own converts them. hc, norm: an MTP layer's own hc_head and norm (its head
        weight is the model's)."""
        B = h.shape[0]
        hc, norm = hc or self.hc_head, self.norm if norm is None else norm
        with phase("head"), rows_alone():
            y = rms_norm(hc_head(h, *hc, self.cfg), norm, self.cfg.rms_norm_eps)
            local = dense(y, self.head_w.dequant(self.dtype), source=self.head_w.data)  # [B, vocab / world]
            with phase("collective"):
                full = self.comm.all_gather(local.reshape(-1))  # rank-major: [world * B * vocab / world]
            return full.view(self.comm.world, B, -1).transpose(0, 1).reshape(B, -1)

    def score(self, h: torch.Tensor, targets: torch.Tensor, top: int, block: int = 256) -> tuple[torch.Tensor, ...]:
        """Rows' final streams h [T, hc, D] scored against targets [T] (row t's next token): each row's logits by
        `head` (a step's head), log_softmax in fp32 -> (the targets' log-probabilities [T], the `top` most likely
        tokens' log-probabilities [T, top] and ids [T, top], most likely first, the targets' ranks [T]: 1 + the tokens
        more likely). `block` rows at a time: a row's vocab-wide logits are the memory (Flash: 0.5 MB a row in fp32)."""
        chosen, ranks, top_lp, top_ids = [], [], [], []
        for start in range(0, h.shape[0], block):
            lp = torch.log_softmax(self.head(h[start:start + block]).float(), dim=-1)
            chosen.append(lp.gather(-1, targets[start:start + block].view(-1, 1)))
            ranks.append((lp > chosen[-1]).sum(dim=-1) + 1)
            chosen[-1] = chosen[-1].view(-1)
            if top:
                values, ids = lp.topk(top, dim=-1)
                top_lp.append(values)
                top_ids.append(ids)
        empty = h.new_zeros((h.shape[0], 0), dtype=torch.float32)
        return (torch.cat(chosen), torch.cat(top_lp) if top else empty,
                torch.cat(top_ids) if top else empty.long(), torch.cat(ranks))

    # ---- the transaction ---------------------------------------------------
    def transaction(self, states: list[DecodeState], tokens: torch.Tensor,
                    active: torch.Tensor | None = None, by_position: bool = True,
                    streams: list | None = None) -> torch.Tensor:
        """forward -> verdict -> commit -> head for T tokens of each state (tokens [B*T], sequence-major);
        returns the device verdict (0 = committed). One verdict for the whole step: a refused
        collective commits nothing for any sequence. `active` [B] bool: rows that commit (a batched
        step's rows without a sequence compute and change nothing; None: all). by_position: as forward's.
        streams: a list that receives every row's final streams [B*T, hc, D] (a scored prefill reads them: score)."""
        B = len(states)
        T = tokens.shape[0] // B
        rows = _Rows(states, pool_of(states))
        # bookkeeping CONFIG fold_settle: each state's settle counts its forward and reads the verdict itself
        folded = bookkeeping.CONFIG["fold_settle"] and rows.pool is None
        self.comm.begin_step()
        if not folded:
            rows.count(0, None if active is None else active if LAYOUT["batch_lean"] else active.long())
        writes, h = self.forward(states, tokens, active, by_position)
        self.comm.end_step()
        verdict = self.comm.verdict
        ok = None if folded else verdict == 0
        with phase("commit"):
            commit(writes, verdict)
        if streams is not None:
            streams.append(h)
        last = h[T - 1::T]  # each sequence's last row [B, hc, D]
        logits = self.head(last)
        if folded:
            rows.settle_folded(verdict, active, last, logits, T)
        else:
            rows.settle(ok if active is None else ok & active, last, logits, T)
        return verdict


    def verify(self, state: DecodeState, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Undo]:
        """A verify step's forward and head (dsv4.speculative): tokens [R] of one sequence at pos, pos + 1, ...; row
        j computed as the decode step at pos + j would compute it (its row-wise work with the others', rows alone;
        its attention after rows 0..j-1 have written their cache rows). -> (streams [R, hc, D], logits [R, vocab],
        the applied writes to take back). The step's collectives stay open (comm.begin_step ran, end_step has not:
        the MTP layer's may join them, under one verdict); nothing of the state but its caches has changed: the
        caller ends the step, chooses the rows to keep, takes back the others (every row when the verdict
        refuses) and settles."""
        R = tokens.shape[0]
        undo = Undo()
        self.comm.begin_step()
        state.counts[0].add_(1)
        writes, h = self.forward([state.ahead(j) for j in range(R)], tokens, undo=undo)
        assert not writes, "a verify step stages nothing: its writes are applied as its rows go"
        return h, self.head(h), undo

    def mtp_rows(self, states: list[DecodeState], h: torch.Tensor, tokens: torch.Tensor, undo: Undo | None,
                 j: int = 0, writes: list[Write] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """MTP layer j (DeepSeek-V4's multi-token prediction: the reference's MTPBlock) over rows of one sequence in
        turn, as Transformer.verify's: row r at states[r].pos, from the main model's streams h[r] [hc, D] there and
        the token after that position, tokens[r] -> (its streams [R, hc, D], logits [R, vocab] of the token after
        tokens[r]). Its window rows go to each state's mtp_caches[j] through undo. The embedding and the head's
        weight are the main model's; hnorm normalises each stream and e_proj's row joins every stream; then the
        layer (mHC, sliding attention, MoE) and the layer's own hc_head and norm. Its collectives join the step the
        caller holds open (comm.begin_step ... end_step). (dsv4.oracle.hf_mtp_logits is its reference.)
        undo None: the rows are one chunk instead (states: one state at the chunk's first position), its window
        writes staged into `writes` for the caller's commit, and no logits (a prompt's rows: the window's warm-up)."""
        cfg, L = self.cfg, self.mtp[j]
        i, (R, hc, D), eps = cfg.num_hidden_layers + j, h.shape, cfg.rms_norm_eps
        T = 1 if undo is not None else R
        alone = short_chunk(T)
        steps = [Step(s.pos, T, self.rope, cfg.sliding_window, None, s.host_pos) for s in states]
        with rows_alone(alone, T):
            e = rms_norm(self.embed.index_select(0, tokens).to(self.dtype), L["enorm"], eps)
            x = linear(e, L["e_proj"]).unsqueeze(1) + linear(rms_norm(h, L["hnorm"], eps).reshape(R * hc, D),
                                                            L["h_proj"]).view(R, hc, D)
            post, comb, collapsed = hc_pre(x, *L["hc"]["attn"], cfg)
            with phase("attention"):
                a = attention(rms_norm(collapsed, L["attn_norm"], eps), steps, L["attn"],
                              [s.mtp_caches[j] for s in states], i, cfg, self.heads,
                              [] if writes is None else writes, None, undo)
            x, post, comb, y = self._boundary(self._reduce(a, i, "attention"), post, comb, x, L, "ffn", alone,
                                              (i, "moe"))
            with phase("moe"):
                f = moe(y, tokens, L["ffn"], self.experts.start, cfg, self.comm.payload(i, "moe", y.dtype))
            x = self._boundary(self._reduce(f, i, "moe"), post, comb, x, None, "attn", alone, (i + 1, "attention"))[0]
        return x, None if undo is None else self.head(x, L["hc_head"], L["norm"])


def _settle_state(s: DecodeState, keep: torch.Tensor, last: torch.Tensor, logits: torch.Tensor, T: int):
    """One state's settle in torch's ops (where the settle kernel does not take it): where keep (0-dim) holds,
    hidden = last, pos += T, commits += 1, logits = logits."""
    s.hidden.copy_(torch.where(keep, last, s.hidden))
    s.pos.add_(keep.long() * T)
    s.counts[1].add_(keep.long())
    s.logits.copy_(torch.where(keep, logits, s.logits))


class _Rows:
    """The transaction's per-state bookkeeping (step counters, hidden, pos, logits): one state at a time, or,
    when every state is a slot of one StatePool, one op per buffer over the pool's rows (the same bytes)."""

    def __init__(self, states: list[DecodeState], pool: StatePool | None):
        self.states, self.pool = states, pool
        self.ids = None if pool is None else pool.index(states)

    def count(self, column: int, delta: torch.Tensor | None):
        """counts[:, column] += delta [B] (None: 1 for every row)."""
        if self.pool is None:
            for b, s in enumerate(self.states):
                s.counts[column].add_(1 if delta is None else delta[b])
            return
        if delta is None:
            delta = torch.ones(len(self.states), dtype=torch.int64, device=self.ids.device)
        self.pool.store.counts.select(1, column).index_add_(0, self.ids, delta.long())  # an int64 delta: itself

    def settle_folded(self, verdict: torch.Tensor, active: torch.Tensor | None, last: torch.Tensor,
                      logits: torch.Tensor, T: int):
        """settle where the step committed (verdict == 0) and, batched, the row is active, and each state's forward
        count + 1 (+ active): one launch a state (bookkeeping CONFIG fold_settle; states not of a pool), or torch's
        ops where the kernel does not take the state (the same values)."""
        for b, s in enumerate(self.states):
            a = None if active is None else active[b]
            if kernels.use_triton(verdict, gpu_checked=bookkeeping.GPU_CHECKED) and bookkeeping.settle_supported(
                    verdict, last[b], s.hidden, logits[b], s.logits):
                bookkeeping.settle(verdict, last[b], s.hidden, logits[b], s.logits, s.pos, s.counts[1], T,
                                   forwards=s.counts[0], active=a)
                continue
            s.counts[0].add_(1 if a is None else a)
            _settle_state(s, verdict == 0 if a is None else (verdict == 0) & a, last[b], logits[b], T)

    def settle(self, keep: torch.Tensor, last: torch.Tensor, logits: torch.Tensor, T: int):
        """Where keep (0-dim, or [B]) holds: hidden = last, pos += T, commits += 1, logits = logits."""
        if self.pool is None:
            for b, s in enumerate(self.states):
                k = keep if keep.dim() == 0 else keep[b]
                if kernels.use_triton(k, gpu_checked=bookkeeping.GPU_CHECKED) and bookkeeping.settle_supported(
                        k, last[b], s.hidden, logits[b], s.logits):
                    bookkeeping.settle(k, last[b], s.hidden, logits[b], s.logits, s.pos, s.counts[1], T)
                    continue
                _settle_state(s, k, last[b], logits[b], T)
            return
        store, ids = self.pool.store, self.ids
        keep = keep.expand(len(self.states))
        store.hidden.index_copy_(0, ids, torch.where(keep.view(-1, 1, 1), last, store.hidden.index_select(0, ids)))
        store.pos.index_add_(0, ids, keep.long() * T)
        self.count(1, keep.long())
        store.logits.index_copy_(0, ids, torch.where(keep.view(-1, 1), logits, store.logits.index_select(0, ids)))
