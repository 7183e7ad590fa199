"""The forward and the step transaction: forward -> verdict -> commit -> head.

One forward serves prefill chunks and one-token decode, eager or captured in a
CUDA graph, on one rank or many. It reads the DecodeState and stages every
write (`Write`); the commit applies them only where the step's verdict is 0 (no
collective refused), on device, with masked copies. No `.item()`, no host
branch on device values, no shape that depends on data.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import HASH_MOE, ModelConfig
from ..formats import QWeight
from ..layout import check_split, expert_range
from ..parallel import Comm
from ..profile import phase
from ..state import DecodeState
from .attention import attention
from .commit import Write, commit
from .hc import hc_head, hc_post, hc_pre
from .moe import moe
from .norm import rms_norm
from .rope import Rope
from .step import Step


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
        self.weights = weights  # by official name (experts now live stacked in self.layers)
        self.trace = None  # a Counter while a graph is being captured (see dsv4.replay)

    def flat_weights(self) -> dict:
        return self.weights

    def _layer(self, wt: dict, i: int) -> dict:
        p, cfg = f"layers.{i}.", self.cfg
        get = lambda name: wt[p + name]  # noqa: E731
        attn = {k: get("attn." + k + ".weight") for k in ("wq_a", "q_norm", "wq_b", "wkv", "kv_norm", "wo_a", "wo_b")}
        attn["attn_sink"] = get("attn.attn_sink")
        if cfg.compress_rate(i):
            attn["compressor"] = self._compressor(wt, p + "attn.compressor.")
            if p + "attn.indexer.wq_b.weight" in wt:
                attn["indexer"] = self._compressor(wt, p + "attn.indexer.compressor.")
                attn["indexer"]["wq_b"] = get("attn.indexer.wq_b.weight")
                attn["indexer"]["weights_proj"] = get("attn.indexer.weights_proj.weight")
        ffn = {"gate": get("ffn.gate.weight")}
        if cfg.mlp_layer_types[i] == HASH_MOE:
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
    def _compressor(wt: dict, p: str) -> dict:
        return {"wkv": wt[p + "wkv.weight"], "wgate": wt[p + "wgate.weight"], "ape": wt[p + "ape"],
                "norm": wt[p + "norm.weight"]}

    # ---- the math ----------------------------------------------------------
    def forward(self, state: DecodeState, tokens: torch.Tensor) -> tuple[list[Write], torch.Tensor]:
        """tokens [T] at positions state.pos.. -> (staged writes, final streams [T, hc, D])."""
        cfg, comm = self.cfg, self.comm
        T = tokens.shape[0]
        step = Step(state.pos, T, self.rope, cfg.sliding_window)
        x = self.embed[tokens].to(self.dtype)
        self._count("embedding")
        h = x.unsqueeze(1).expand(T, cfg.hc_mult, cfg.hidden_size).contiguous()
        writes: list[Write] = []
        for i, L in enumerate(self.layers):
            with phase("mhc"):
                post, comb, collapsed = hc_pre(h, *L["hc"]["attn"], cfg)
            with phase("attention"):
                a = attention(rms_norm(collapsed, L["attn_norm"], cfg.rms_norm_eps), step, L["attn"],
                              state.layers[i], i, cfg, self.heads, writes)
            h = self._post(self._reduce(a, i, "attention"), post, comb, h)
            with phase("mhc"):
                post, comb, collapsed = hc_pre(h, *L["hc"]["ffn"], cfg)
            with phase("moe"):
                f = moe(rms_norm(collapsed, L["ffn_norm"], cfg.rms_norm_eps), tokens, L["ffn"], self.experts.start,
                        cfg)
            h = self._post(self._reduce(f, i, "moe"), post, comb, h)
        return writes, h

    def _reduce(self, x, layer: int, site: str):
        with phase("collective"):
            return self.comm.all_reduce(x, layer, site)

    def _count(self, what: str, n: int = 1):
        if self.trace is not None:
            self.trace[what] += n

    def _post(self, reduced, post, comb, h):
        self._count("collective")
        self._count("hc_post")
        with phase("mhc"):
            return hc_post(reduced, post, comb, h)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Streams [hc, D] of the last token -> fp32 logits [vocab] (vocab-parallel, gathered)."""
        with phase("head"):
            y = rms_norm(hc_head(h.unsqueeze(0), *self.hc_head, self.cfg), self.norm, self.cfg.rms_norm_eps)
            local = F.linear(y, self.head_w.dequant(self.dtype))[0]
            return self.comm.all_gather(local).float()

    # ---- the transaction ---------------------------------------------------
    def transaction(self, state: DecodeState, tokens: torch.Tensor) -> torch.Tensor:
        """forward -> verdict -> commit -> head for tokens [T]; returns the device verdict (0 = committed)."""
        self.comm.begin_step()
        state.counts[0].add_(1)
        writes, h = self.forward(state, tokens)
        self.comm.end_step()
        verdict = self.comm.verdict
        ok = verdict == 0
        with phase("commit"):
            commit(writes, verdict)
        last = h[-1]
        state.hidden.copy_(torch.where(ok, last, state.hidden))
        state.pos.add_(ok.long() * tokens.shape[0])
        state.counts[1].add_(ok.long())
        state.logits.copy_(torch.where(ok, self.head(last), state.logits))
        return verdict
