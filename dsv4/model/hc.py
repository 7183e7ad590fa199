"""Manifold-Constrained Hyper-Connections (mHC, paper section 2.2).

The residual is `hc_mult` parallel streams [T, hc, D]. Before each sublayer a
mixing map computed from the streams gives `pre` (collapse weights), `post`
(where the sublayer's output goes) and `comb` (a Sinkhorn-projected, doubly
stochastic stream mixer). The head collapses the streams once more.
"""

from __future__ import annotations

import torch

from .. import kernels
from ..config import ModelConfig
from ..kernels import hc as fused_pre
from ..kernels import hc_head as fused_head
from ..kernels import hc_post as fused_post
from .linear import dense
from .rows import per_row
from .norm import unweighted_rms_norm


def hc_pre(h: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, cfg: ModelConfig):
    """h [T, hc, D] -> (post [T, hc], comb [T, hc, hc], collapsed [T, D])."""
    hc, eps = cfg.hc_mult, cfg.hc_eps
    if kernels.enabled(fused_pre, h) and fused_pre.supported(h, hc):
        mix = dense(h.flatten(-2).float(), fn.float(), source=fn)  # row by row in a decode step (dsv4.model.rows)
        return fused_pre.hc_pre(h, mix, base, scale, hc, cfg.hc_sinkhorn_iters, cfg.rms_norm_eps, eps)
    return _hc_pre(h, fn, base, scale, cfg)


@per_row()
def _hc_pre(h, fn, base, scale, cfg: ModelConfig):
    hc, eps = cfg.hc_mult, cfg.hc_eps
    flat = unweighted_rms_norm(h.flatten(-2).float(), cfg.rms_norm_eps)
    pre_w, post_w, comb_w = dense(flat, fn.float(), source=fn).split([hc, hc, hc * hc], dim=-1)
    pre_b, post_b, comb_b = base.split([hc, hc, hc * hc])
    pre = torch.sigmoid(pre_w * scale[0] + pre_b) + eps
    post = 2 * torch.sigmoid(post_w * scale[1] + post_b)
    comb = sinkhorn(comb_w.unflatten(-1, (hc, hc)) * scale[2] + comb_b.view(hc, hc), cfg.hc_sinkhorn_iters, eps)
    collapsed = (pre.unsqueeze(-1) * h).sum(dim=-2).to(h.dtype)
    return post, comb, collapsed


def sinkhorn(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """comb [..., hc, hc] from its logits: each row's softmax plus eps, then Sinkhorn-Knopp, alternate column and
    row normalisation towards a doubly stochastic matrix (iters column normalisations, iters - 1 row ones)."""
    comb = torch.softmax(logits, dim=-1) + eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return comb


def hc_post(out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """new[k] = post[k] * out + sum_j comb[j, k] * h[j]  (comb is applied transposed)."""
    if kernels.enabled(fused_post, h) and fused_post.supported(h, h.shape[-2]):
        return fused_post.hc_post(out, post, comb, h)
    return _hc_post(out, post, comb, h)


@per_row(1, 2, 3)
def _hc_post(out, post, comb, h):
    dtype = h.dtype
    return post.to(dtype).unsqueeze(-1) * out.unsqueeze(-2) + torch.matmul(comb.to(dtype).transpose(-1, -2), h)


def hc_head(h: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, cfg: ModelConfig):
    """Final collapse of the streams [T, hc, D] -> [T, D]."""
    if kernels.enabled(fused_head, h) and fused_head.supported(h, cfg.hc_mult):
        # row by row in a decode step (dsv4.model.rows); wide_mix: the streams widened by the GEMV as it loads them
        flat = h.flatten(-2)
        mix = dense(flat, fn.float(), source=fn, dtype=torch.float32) if fused_head.CONFIG["wide_mix"] else \
            dense(flat.float(), fn.float(), source=fn)
        return fused_head.hc_head(h, mix, base, scale, cfg.rms_norm_eps, cfg.hc_eps)
    return _hc_head(h, fn, base, scale, cfg)


@per_row()
def _hc_head(h: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, cfg: ModelConfig):
    flat = unweighted_rms_norm(h.flatten(-2).float(), cfg.rms_norm_eps)
    pre = torch.sigmoid(dense(flat, fn.float(), source=fn) * scale.float() + base.float()) + cfg.hc_eps
    return (pre.unsqueeze(-1) * h).sum(dim=-2).to(h.dtype)
