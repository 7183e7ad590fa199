"""How often a draft drawn with the model's own key is the model's draw (CPU; exact, no sampling).

dsv4's speculative steps keep the plain stream bit for bit, so a draft is accepted only when it is the very token
the model draws at its position: the draw inverts the model's CDF p, in vocabulary order, at u(seed, position).
The MTP drafter draws its draft the same way from its own distribution q at the same u (a quantile coupling), so
the two agree on the overlap of each token's CDF interval under p and under q:

    P(draft == draw) = sum_i | [P(i-1), P(i)) n [Q(i-1), Q(i)) |     (P, Q the cumulative sums in vocabulary order)

Rejection sampling (the usual speculative sampling) accepts 1 - TV(p, q) of its drafts, the most any coupling can,
but its tokens are then not the plain stream's. This prints, for distributions of the model's shape (a vocabulary
of 129,280, logits with a chosen spread, the drafter's logits the model's plus Gaussian noise of each size): the
quantile coupling's agreement, 1 - TV (the bound), and a greedy draft's (argmax q drawn against p's sample).

    python benchmarks/coupling_acceptance.py --spread 2 4 8 --noise 0.05 0.1 0.2 0.5 1.0 --temperature 1 0.7
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from dsv4.receipts import emit


def agreement(p: torch.Tensor, q: torch.Tensor) -> float:
    """P(the quantile draws of p and q at one u are the same token): the overlap of their CDF intervals."""
    P, Q = p.double().cumsum(0), q.double().cumsum(0)
    P0, Q0 = P - p.double(), Q - q.double()
    return float((torch.minimum(P, Q) - torch.maximum(P0, Q0)).clamp_min(0).sum())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=129280)
    ap.add_argument("--spread", type=float, nargs="+", default=[2.0, 4.0, 8.0],
                    help="std of the model's logits (larger: a peakier distribution)")
    ap.add_argument("--noise", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.5, 1.0],
                    help="std of the drafter's logit error")
    ap.add_argument("--temperature", type=float, nargs="+", default=[1.0, 0.7])
    ap.add_argument("--trials", type=int, default=8)
    a = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    for spread in a.spread:
        for temperature in a.temperature:
            for noise in a.noise:
                quantile, bound, greedy, top = [], [], [], []
                for _ in range(a.trials):
                    logits = torch.randn(a.vocab, generator=g, dtype=torch.float64) * spread
                    draft_logits = logits + torch.randn(a.vocab, generator=g, dtype=torch.float64) * noise
                    p, q = torch.softmax(logits / temperature, 0), torch.softmax(draft_logits / temperature, 0)
                    quantile.append(agreement(p, q))
                    bound.append(1 - 0.5 * float((p - q).abs().sum()))
                    greedy.append(float(p[draft_logits.argmax()]))
                    top.append(float(p.max()))
                emit("COUPLING", vocab=a.vocab, spread=spread, temperature=temperature, noise=noise,
                     top_prob=round(statistics.mean(top), 4), quantile_agreement=round(statistics.mean(quantile), 4),
                     rejection_bound=round(statistics.mean(bound), 4), greedy_draft=round(statistics.mean(greedy), 4))
    return 0


if __name__ == "__main__":
    sys.exit(main())
