"""Is a sampled row the same alone and in a batch? The draw's CDF scan, before and after session 5's fix.

    python benchmarks/sampler_invariance.py [--device cuda] [--vocab 129280] [--draws 2048]

Arms: "masked_sum_offsets" (sessions 1-3), "one_scan_for_all_rows" (session 4: one torch.cumsum over the
whole [B, V] batch), "per_row" (dsv4.sampler._cumsum now: each row scanned as [1, V]). For batches of
B = 2..32 rows of random distributions, one record per arm and B:

  SCAN_INVARIANCE  arm, rows, rows whose CDF bits differ from the row scanned alone, and of the draws
                   (each row drawn at --draws positions, temperature 1) how many pick another token
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from dsv4.receipts import emit
from dsv4.sampler import _SCAN_ROW, _cumsum, _uniform_keyed


def one_scan_for_all_rows(x):
    V = x.shape[-1]
    R = -(-V // _SCAN_ROW)
    rows = F.pad(x, (0, R * _SCAN_ROW - V)).unflatten(-1, (R, _SCAN_ROW))
    inner = torch.cumsum(rows, dim=-1)
    offsets = torch.cumsum(F.pad(inner[..., :-1, -1], (1, 0)), dim=-1)
    return (inner + offsets.unsqueeze(-1)).flatten(-2)[..., :V]


def masked_sum_offsets(x):
    V = x.shape[-1]
    R = -(-V // _SCAN_ROW)
    rows = F.pad(x, (0, R * _SCAN_ROW - V)).unflatten(-1, (R, _SCAN_ROW))
    inner = torch.cumsum(rows, dim=-1)
    totals = inner[..., -1]
    below = torch.arange(R, device=x.device).unsqueeze(0) < torch.arange(R, device=x.device).unsqueeze(1)
    offsets = (totals.unsqueeze(-2) * below).sum(-1)
    return (inner + offsets.unsqueeze(-1)).flatten(-2)[..., :V]


def draws(cdf, key, positions):
    """The token index each position's uniform lands on (inverse CDF), per row: [B, P]."""
    u = _uniform_keyed(key.unsqueeze(-1), positions.unsqueeze(0))  # [B, P]
    target = u * cdf[:, -1:]
    return torch.searchsorted(cdf, target.contiguous(), right=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--vocab", type=int, default=129280)
    ap.add_argument("--draws", type=int, default=2048)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(5)
    arms = {"masked_sum_offsets": masked_sum_offsets, "one_scan_for_all_rows": one_scan_for_all_rows,
            "per_row": _cumsum}
    positions = torch.arange(args.draws, device=args.device)
    for B in (2, 4, 8, 16, 32):
        probs = torch.softmax(torch.randn(B, args.vocab, generator=gen) * 4, dim=-1)
        probs = probs.sort(dim=-1, descending=True).values.to(args.device)  # the draw scans sorted probs
        key = torch.randint(0, 2**62, (B,), generator=gen).to(args.device)
        for name, scan in arms.items():
            batched = scan(probs)
            alone = torch.cat([scan(probs[b:b + 1]) for b in range(B)])
            rows_differ = int((batched != alone).any(-1).sum())
            flips = int((draws(batched, key, positions) != draws(alone, key, positions)).sum())
            emit("SCAN_INVARIANCE", {"arm": name, "rows": B, "rows_cdf_differ": rows_differ,
                                     "draws": B * args.draws, "draws_differ": flips, "device": args.device})


if __name__ == "__main__":
    main()
