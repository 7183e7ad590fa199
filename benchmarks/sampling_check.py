"""The GPU check of the sampler's logit processing (Model.step_batch_processed): before the server serves
penalties, logit_bias, min_p, logprobs and a grammar's allowed tokens (response_format, forced tool calls) on CUDA
(DSV4_UNCHECKED_SAMPLING=1 until then; session 5 checked all but the grammar's mask, which session 51 added here).

    python benchmarks/sampling_check.py --preset mini --device cuda --rows 4 --steps 24 [--ranks 2]

Rows of a fixed prompt each with its own processing (one row without any); the even rows also carry a grammar's
mask at every step (an int32 bitmask of about one token in eight, drawn from (row, step): `step_mask`), as the
server's Constraint fills it. Arms, each from fresh states:
  solo-eager   each row alone, eager (the reference)
  batch-eager  all rows in one eager step
  batch-graph  all rows in one captured batch graph (the processed bucket graph), replayed
  plain-graph  the same rows without processing, graph: equal to step_batch's tokens (no processing ops)
Records (one line each):
  SAMPLING_CHECK  arm, equal (tokens and logprobs equal to solo-eager, bit for bit), first mismatch
  SAMPLING_TIME   arm (plain-graph | batch-graph), ms per step (median of the timed steps)
  SAMPLING_MASK   every masked row's token, in every processed arm, one its mask allows (allowed: true)
Exit 1 when an arm differs or a token falls outside its mask.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import dsv4
from dsv4.receipts import emit
from dsv4.sampler import LogitsParams, Processing, SamplingParams

PROCESSING = [LogitsParams(presence_penalty=1.0, frequency_penalty=0.5, logprobs=5), None,
              LogitsParams(repetition_penalty=1.3, min_p=0.05, logprobs=0), LogitsParams(logit_bias=((100, 2.5),)),
              LogitsParams(min_p=0.1, logprobs=20), LogitsParams(presence_penalty=-0.5)]


def rows(args):
    samplings = [SamplingParams(temperature=[1.0, 0.0, 0.8, 1.2][b % 4], top_k=[0, 0, 40, 0][b % 4], seed=100 + b)
                 for b in range(args.rows)]
    return samplings, [PROCESSING[b % len(PROCESSING)] for b in range(args.rows)]


def step_mask(vocab: int, row: int, step: int, device) -> torch.Tensor | None:
    """Row `row`'s allowed tokens at `step` (even rows only; None: every token), an int32 bitmask [ceil(vocab / 32)]
    as xgrammar fills it (bit j of word i: token 32 i + j): about one token in eight, from (row, step) alone."""
    if row % 2:
        return None
    g = torch.Generator().manual_seed(1000 * row + step)
    allowed = torch.rand(vocab, generator=g) < 0.125
    allowed[(7 * step + row) % vocab] = True  # never empty
    bits = torch.zeros((vocab + 31) // 32 * 32, dtype=torch.int64)
    bits[:vocab] = allowed.long()
    words = (bits.view(-1, 32) << torch.arange(32)).sum(dim=1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32).to(device)


def allowed(mask: torch.Tensor, token: int) -> bool:
    return bool((int(mask[token // 32]) >> (token % 32)) & 1)


def fresh(model, prompt, capacity):
    state = model.new_state(capacity)
    model.prefill(state, prompt[:-1])
    return state


def run(model, args, which: list[int], graph: bool, processed: bool):
    samplings, params = rows(args)
    prompt = model.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 4)
    states = [fresh(model, prompt, len(prompt) + args.steps + 8) for _ in which]
    tokens, out, times, outside = [prompt[-1]] * len(which), [], [], []
    for step in range(args.steps):
        model.synchronize()
        t0 = time.perf_counter()
        if processed:
            masks = [step_mask(model.cfg.vocab_size, b, step, model.device) for b in which]
            proc = [None if params[b] is None and m is None else
                    Processing(params[b] or LogitsParams(), tuple(prompt) if step == 0 else None, m)
                    for b, m in zip(which, masks)]
            drawn = model.step_batch_processed(states, tokens, [samplings[b] for b in which], proc, graph=graph)
        else:
            drawn = model.step_batch(states, tokens, [samplings[b] for b in which], graph=graph)
        model.synchronize()
        times.append(time.perf_counter() - t0)
        tokens = [getattr(d, "token", d) for d in drawn]
        if processed:
            outside.extend((step, b) for b, m, t in zip(which, masks, tokens) if m is not None and not allowed(m, t))
        out.append(list(drawn))
    for s in states:
        s.discard()
    if outside:
        emit("SAMPLING_MASK", arm=("graph" if graph else "eager") + f" rows {which}", allowed=False,
             outside=outside[:8])
    return out, statistics.median(times[2:]) * 1e3 if len(times) > 2 else None, not outside


def compare(reference, got):
    for step, (a, b) in enumerate(zip(reference, got)):
        for row, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return {"step": step, "row": row, "solo": repr(x)[:300], "batched": repr(y)[:300]}
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--steps", type=int, default=24)
    args = ap.parse_args()
    model = dsv4.load(args.preset, device=args.device, ranks=args.ranks)
    graph = model.device.type == "cuda"
    solo = [run(model, args, [b], False, True) for b in range(args.rows)]
    inside = all(s[2] for s in solo)
    reference = [[solo[b][0][step][0] for b in range(args.rows)] for step in range(args.steps)]
    ok = True
    for arm, use_graph in (("batch-eager", False), ("batch-graph", graph)):
        got, ms, arm_inside = run(model, args, list(range(args.rows)), use_graph, True)
        miss = compare(reference, got)
        inside &= arm_inside
        ok &= miss is None
        emit("SAMPLING_CHECK", arm=arm, graph=use_graph, equal=miss is None, first_mismatch=miss)
        if use_graph:
            emit("SAMPLING_TIME", arm=arm, ms_per_step=ms, rows=args.rows)
    emit("SAMPLING_MASK", arm="solo-eager, batch-eager, batch-graph", allowed=inside,
         masked_rows=[b for b in range(args.rows) if b % 2 == 0])
    ok &= inside
    plain, ms, _ = run(model, args, list(range(args.rows)), graph, False)
    plain_eager, _, _ = run(model, args, list(range(args.rows)), False, False)
    miss = compare(plain_eager, plain)
    ok &= miss is None
    emit("SAMPLING_CHECK", arm="plain-graph", graph=graph, equal=miss is None, first_mismatch=miss)
    emit("SAMPLING_TIME", arm="plain-graph", ms_per_step=ms, rows=args.rows)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
