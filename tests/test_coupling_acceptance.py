"""benchmarks/coupling_acceptance.py's exact agreement of two quantile draws: 1 for equal distributions, the
Monte Carlo rate of equal draws at shared uniforms otherwise (within its sampling error), never above 1 - TV."""

from __future__ import annotations

import torch

from benchmarks.coupling_acceptance import agreement, gumbel_agreement


def test_agreement_is_the_rate_of_equal_quantile_draws():
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(50, generator=g, dtype=torch.float64) * 2, 0)
    q = torch.softmax(torch.log(p) + torch.randn(50, generator=g, dtype=torch.float64) * 0.5, 0)
    assert abs(agreement(p, p) - 1) < 1e-12
    u = torch.rand(200_000, generator=g, dtype=torch.float64)
    draw = lambda d: torch.searchsorted(d.cumsum(0), u, right=True).clamp_max(49)  # noqa: E731
    rate = float((draw(p) == draw(q)).double().mean())
    assert abs(agreement(p, q) - rate) < 0.005
    assert agreement(p, q) <= 1 - 0.5 * float((p - q).abs().sum()) + 1e-12


def test_gumbel_agreement_is_the_rate_of_equal_gumbel_max_draws():
    """The Gumbel coupling's closed form: 1 for equal distributions, the Monte Carlo rate of equal argmaxes under
    shared Gumbel noise otherwise, never above 1 - TV; and far above the quantile coupling at a flat distribution."""
    g = torch.Generator().manual_seed(2)
    p = torch.softmax(torch.randn(50, generator=g, dtype=torch.float64) * 2, 0)
    q = torch.softmax(torch.log(p) + torch.randn(50, generator=g, dtype=torch.float64) * 0.5, 0)
    assert abs(gumbel_agreement(p, p) - 1) < 1e-12
    u = torch.rand(100_000, 50, generator=g, dtype=torch.float64).clamp_min(1e-300)
    noise = -torch.log(-torch.log(u))
    rate = float(((torch.log(p) + noise).argmax(1) == (torch.log(q) + noise).argmax(1)).double().mean())
    assert abs(gumbel_agreement(p, q) - rate) < 0.006
    assert gumbel_agreement(p, q) <= 1 - 0.5 * float((p - q).abs().sum()) + 1e-12
    flat = torch.softmax(torch.randn(5000, generator=g, dtype=torch.float64) * 0.5, 0)
    near = torch.softmax(torch.log(flat) + torch.randn(5000, generator=g, dtype=torch.float64) * 0.1, 0)
    assert gumbel_agreement(flat, near) > 0.85 > 0.5 > agreement(flat, near)
