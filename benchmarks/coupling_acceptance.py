"""How often a draft drawn with the model's own key is the model's draw (CPU; exact, no sampling).

dsv4's speculative steps keep the plain stream bit for bit, so a draft is accepted only when it is the very token
the model draws at its position: the draw inverts the model's CDF p, in vocabulary order, at u(seed, position).
The MTP drafter draws its draft the same way from its own distribution q at the same u (a quantile coupling), so
the two agree on the overlap of each token's CDF interval under p and under q:

    P(draft == draw) = sum_i | [P(i-1), P(i)) n [Q(i-1), Q(i)) |     (P, Q the cumulative sums in vocabulary order)

Rejection sampling (the usual speculative sampling) accepts 1 - TV(p, q) of its drafts, the most any coupling can,
but its tokens are then not the plain stream's. A sampler drawing by Gumbel-max instead (argmax of log p + G_i, one
G_i a token from the key: an exponential race), with the drafter using the same G, keeps the stream identity too and
agrees where the two argmaxes meet (gumbel_agreement, exact). This prints, for distributions of the model's shape (a
vocabulary of 129,280, logits with a chosen spread, the drafter's logits the model's plus Gaussian noise of each
size): the quantile coupling's agreement, the Gumbel coupling's, 1 - TV (the bound), and a greedy draft's (argmax q
drawn against p's sample).

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


def gumbel_agreement(p: torch.Tensor, q: torch.Tensor) -> float:
    """P(the Gumbel-max draws of p and q with shared noise are the same token): argmax(log p + G) and
    argmax(log q + G), one G_i per token. Token i wins both where every G_j < G_i + min(log p_i/p_j, log q_i/q_j);
    integrating over G_i gives 1 / sum_j max(p_j/p_i, q_j/q_i), and splitting j by r_j = p_j/q_j against r_i:

        P = sum_i 1 / ( sum_{r_j > r_i} p_j / p_i  +  sum_{r_j <= r_i} q_j / q_i )

    exact, in one sort (tokens where p or q is 0 never win both)."""
    p, q = p.double(), q.double()
    live = (p > 0) & (q > 0)
    p, q = p[live], q[live]
    r = p / q
    order = torch.argsort(r)
    r, p, q = r[order], p[order], q[order]
    upto = torch.searchsorted(r, r, right=True)  # tokens with r_j <= r_i: the first `upto` of the sorted order
    q_le = torch.cat([q.new_zeros(1), q.cumsum(0)])[upto]
    p_gt = p.sum() - torch.cat([p.new_zeros(1), p.cumsum(0)])[upto]
    return float((1 / (p_gt / p + q_le / q)).sum())


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
                quantile, gumbel, bound, greedy, top = [], [], [], [], []
                for _ in range(a.trials):
                    logits = torch.randn(a.vocab, generator=g, dtype=torch.float64) * spread
                    draft_logits = logits + torch.randn(a.vocab, generator=g, dtype=torch.float64) * noise
                    p, q = torch.softmax(logits / temperature, 0), torch.softmax(draft_logits / temperature, 0)
                    quantile.append(agreement(p, q))
                    gumbel.append(gumbel_agreement(p, q))
                    bound.append(1 - 0.5 * float((p - q).abs().sum()))
                    greedy.append(float(p[draft_logits.argmax()]))
                    top.append(float(p.max()))
                emit("COUPLING", vocab=a.vocab, spread=spread, temperature=temperature, noise=noise,
                     top_prob=round(statistics.mean(top), 4), quantile_agreement=round(statistics.mean(quantile), 4),
                     gumbel_agreement=round(statistics.mean(gumbel), 4),
                     rejection_bound=round(statistics.mean(bound), 4), greedy_draft=round(statistics.mean(greedy), 4))
    return 0


if __name__ == "__main__":
    sys.exit(main())
