"""The GPU check of the sampler's logit processing (Model.step_batch_processed): before the server serves
penalties, logit_bias, min_p, logprobs and response_format on CUDA (DSV4_UNCHECKED_SAMPLING=1 until then).

    python benchmarks/sampling_check.py --preset mini --device cuda --rows 4 --steps 24 [--ranks 2]

Rows of a fixed prompt each with its own processing (one row without any). Arms, each from fresh states:
  solo-eager   each row alone, eager (the reference)
  batch-eager  all rows in one eager step
  batch-graph  all rows in one captured batch graph (the processed bucket graph), replayed
  plain-graph  the same rows without processing, graph: equal to step_batch's tokens (no processing ops)
Records (one line each):
  SAMPLING_CHECK  arm, equal (tokens and logprobs equal to solo-eager, bit for bit), first mismatch
  SAMPLING_TIME   arm (plain-graph | batch-graph), ms per step (median of the timed steps)
Exit 1 when an arm differs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

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


def fresh(model, prompt, capacity):
    state = model.new_state(capacity)
    model.prefill(state, prompt[:-1])
    return state


def run(model, args, which: list[int], graph: bool, processed: bool):
    samplings, params = rows(args)
    prompt = model.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 4)
    states = [fresh(model, prompt, len(prompt) + args.steps + 8) for _ in which]
    tokens, out, times = [prompt[-1]] * len(which), [], []
    for step in range(args.steps):
        model.synchronize()
        t0 = time.perf_counter()
        if processed:
            proc = [None if params[b] is None else Processing(params[b], tuple(prompt) if step == 0 else None)
                    for b in which]
            drawn = model.step_batch_processed(states, tokens, [samplings[b] for b in which], proc, graph=graph)
        else:
            drawn = model.step_batch(states, tokens, [samplings[b] for b in which], graph=graph)
        model.synchronize()
        times.append(time.perf_counter() - t0)
        tokens = [getattr(d, "token", d) for d in drawn]
        out.append(list(drawn))
    for s in states:
        s.discard()
    return out, statistics.median(times[2:]) * 1e3 if len(times) > 2 else None


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
    solo = [run(model, args, [b], False, True)[0] for b in range(args.rows)]
    reference = [[solo[b][step][0] for b in range(args.rows)] for step in range(args.steps)]
    ok = True
    for arm, use_graph in (("batch-eager", False), ("batch-graph", graph)):
        got, ms = run(model, args, list(range(args.rows)), use_graph, True)
        miss = compare(reference, got)
        ok &= miss is None
        emit("SAMPLING_CHECK", arm=arm, graph=use_graph, equal=miss is None, first_mismatch=miss)
        if use_graph:
            emit("SAMPLING_TIME", arm=arm, ms_per_step=ms, rows=args.rows)
    plain, ms = run(model, args, list(range(args.rows)), graph, False)
    plain_eager, _ = run(model, args, list(range(args.rows)), False, False)
    miss = compare(plain_eager, plain)
    ok &= miss is None
    emit("SAMPLING_CHECK", arm="plain-graph", graph=graph, equal=miss is None, first_mismatch=miss)
    emit("SAMPLING_TIME", arm="plain-graph", ms_per_step=ms, rows=args.rows)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
