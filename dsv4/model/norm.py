"""RMSNorm, computed in fp32 as HF does (weight applied after casting back)."""

import torch

from .. import kernels
from ..kernels import norm as fused
from .rows import per_row


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if kernels.enabled(fused, x) and fused.supported(x, weight):
        return fused.rms_norm(x, weight, eps)
    return _rms_norm(x, weight, eps)


@per_row()
def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (weight * xf.to(x.dtype)).to(x.dtype)


def unweighted_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """q_b's per-head norm and mHC's input norm have no weight."""
    if kernels.enabled(fused, x) and fused.supported(x, None):
        return fused.rms_norm(x, None, eps)
    return _unweighted_rms_norm(x, eps)


@per_row()
def _unweighted_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)
