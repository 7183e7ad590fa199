"""The GPU check of a scored prefill (Model.prefill_scored: echo with logprobs), before the server serves it on CUDA
(DSV4_UNCHECKED_SAMPLING=1 until then).

    python benchmarks/score_check.py --preset mini --device cuda [--ranks 2] [--tokens 300] [--chunk 128]

A random prompt, prefilled in chunks twice: plainly (Model.prefill) and scored. Records (one line each):
  SCORE_STATE   the scored prefill's state and logits against the plain one's, byte for byte (equal: true)
  SCORE_LAST    each chunk's last row: its score against the log_softmax of the logits the step's head left in the
                state (the same streams, the same head, each row alone: equal bit for bit)
  SCORE_PREFIX  rows against a prefix's own prefill (its last logits, log_softmax): the largest difference of the
                target's log-probability over --probes rows, and whether each row's top-1 agrees (a prefix prefill
                runs other chunk shapes, so other summation orders: a tolerance, not bits)
  SCORE_TIME    ms of the scored prefill against the plain one, median of --rounds
Exit 1 when SCORE_STATE or SCORE_LAST is not equal, or SCORE_PREFIX's difference passes --tol.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import dsv4
from dsv4.receipts import emit


def chunks(ids: list[int], chunk: int):
    for a in range(0, len(ids) - 1, chunk):
        yield a, ids[a:min(a + chunk, len(ids) - 1)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--probes", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tol", type=float, default=0.05)
    args = ap.parse_args()
    model = dsv4.load(args.preset, device=args.device, ranks=args.ranks)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.cfg.vocab_size, (args.tokens,), generator=g).tolist()
    capacity = args.tokens + 8
    ok = True

    def plain():
        state = model.new_state(capacity)
        for _, piece in chunks(ids, args.chunk):
            model.prefill(state, piece)
        return state

    def scored():
        state, out, last = model.new_state(capacity), [], []
        for a, piece in chunks(ids, args.chunk):
            out += model.prefill_scored(state, piece, ids[a + 1:a + 1 + len(piece)], args.top)
            lp = torch.log_softmax(state.logits.float(), dim=-1)
            last.append((out[-1].logprob, float(lp[ids[a + len(piece)]])))
        return state, out, last

    a, (b, scores, last) = plain(), scored()
    same = a.digest() == b.digest() and torch.equal(a.logits, b.logits)
    emit("SCORE_STATE", equal=same, rows=len(scores))
    exact = all(x == y for x, y in last)
    emit("SCORE_LAST", equal=exact, chunks=len(last), first=last[0])
    ok &= same and exact
    worst, agree = 0.0, []
    for t in torch.linspace(1, len(ids) - 2, args.probes).long().tolist():
        state = model.new_state(capacity)
        model.prefill(state, ids[:t + 1])  # row t's own step: the prefix through ids[t]
        lp = torch.log_softmax(state.logits.float(), dim=-1)
        worst = max(worst, abs(scores[t].logprob - float(lp[ids[t + 1]])))
        agree.append(scores[t].top[0][0] == int(lp.argmax()) if args.top else None)
    emit("SCORE_PREFIX", max_abs_logprob_diff=worst, tol=args.tol, top1_agrees=agree)
    ok &= worst <= args.tol
    times = {"plain": [], "scored": []}
    for _ in range(args.rounds):
        for arm, run in (("plain", plain), ("scored", scored)):
            model.synchronize()
            t0 = time.perf_counter()
            run()
            model.synchronize()
            times[arm].append((time.perf_counter() - t0) * 1e3)
    emit("SCORE_TIME", tokens=len(ids) - 1, chunk=args.chunk, **{f"{k}_ms": statistics.median(v)
                                                                 for k, v in times.items()})
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
