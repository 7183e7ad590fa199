"""Time to first token of a multi-turn conversation through the server's scheduler, with the prefix cache and
without (dsv4.prefix; `dsv4 serve --prefix-cache`).

A conversation: a system prompt, then turns; turn k's prompt is the system prompt, every earlier message and reply
(the tokens the model drew), and the new message, as a chat client resends it. Arms, in ABBA rows of one process,
each row a fresh scheduler (turn 1 cold):

  plain@default  no cache, the server's default prefill chunk (what `dsv4 serve` does today)
  plain@C        no cache, chunks of C (--chunk)
  cached@C       --prefix-cache at chunks of C: each turn from the last turn's snapshot

Prints per turn the median time to first token of each arm, the prompt tokens each arm prefilled, and whether every
arm drew the same tokens (plain@C and cached@C must, bit for bit; plain@default has other chunk boundaries, so other
bytes: its tokens are shown, not required). Then the conversation's total.

    python benchmarks/prefix_cache_bench.py --preset tiny --device cpu --system 512 --turns 6 --chunk 64
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import dsv4
from dsv4.receipts import emit
from dsv4.serve.scheduler import Scheduler, Sequence


def turn(sched: Scheduler, prompt: list[int], max_tokens: int, sampling) -> tuple[float, list[int], int]:
    """One request driven in this thread: (seconds to its first token, its tokens, the prompt tokens it prefilled)."""
    tokens, done, first = [], [], []

    def emit_(event):
        if event[0] == "token":
            if not first:
                first.append(time.perf_counter())
            tokens.append(event[1])
        else:
            done.append(event)

    seq = Sequence(list(prompt), max_tokens, sampling, emit_, ignore_eos=True)
    start = time.perf_counter()
    sched.submit(seq)
    while not done or sched.running:
        sched._admit()
        sched._round()
    sched._drain()
    sched.model.synchronize()
    assert done[0][0] == "done", done
    return first[0] - start, tokens, len(prompt) - 1 - (seq.cached or 0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, help="float32 | bfloat16 (default: the model's)")
    ap.add_argument("--system", type=int, default=512, help="system prompt tokens")
    ap.add_argument("--message", type=int, default=48, help="tokens of each user message")
    ap.add_argument("--reply", type=int, default=48, help="tokens of each reply (max_tokens, EOS ignored)")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--chunk", type=int, default=64, help="the cached arms' prefill chunk")
    ap.add_argument("--rows", type=int, default=4, help="rows per arm (ABBA)")
    ap.add_argument("--max-model-len", type=int, default=4096)
    a = ap.parse_args()
    kwargs = {"device": a.device}
    if a.dtype:
        kwargs["dtype"] = getattr(torch, a.dtype)
    model = dsv4.load(a.preset, **kwargs)
    vocab = model.cfg.vocab_size
    words = lambda n, s: [(s * 7919 + 31 * j) % (vocab - 3) + 3 for j in range(n)]  # noqa: E731
    default_chunk = model.prefill_chunk(a.max_model_len)
    arms = {"plain@default": (default_chunk, 0), f"plain@{a.chunk}": (a.chunk, 0), f"cached@{a.chunk}": (a.chunk, 2)}
    sampling = dsv4.SamplingParams(temperature=1.0, seed=7)

    def conversation(chunk: int, cache: int, replies: list | None):
        """The turns' (seconds, tokens, prefilled); the replies are the first arm's, so every arm sees one text."""
        sched = Scheduler(model, max_num_seqs=1, max_model_len=a.max_model_len, prefill_chunk=chunk,
                          prefix_cache=cache)
        sched.capture_buckets()  # as `dsv4 serve` does before it listens (CUDA): no turn pays a capture
        history, out = words(a.system, 1), []
        for k in range(a.turns):
            prompt = history + words(a.message, 100 + k)
            seconds, tokens, prefilled = turn(sched, prompt, a.reply, sampling)
            out.append((seconds, tokens, prefilled))
            history = prompt + (replies[k] if replies is not None else tokens)
        return out

    reference = conversation(a.chunk, 0, None)  # warms every kernel too
    replies = [t for _, t, _ in reference]
    times = {name: [[] for _ in range(a.turns)] for name in arms}
    runs = {}
    order = list(arms)
    for row in range(a.rows):
        for name in (order if row % 2 == 0 else order[::-1]):
            got = conversation(*arms[name], replies)
            runs[name] = got
            for k, (seconds, _, _) in enumerate(got):
                times[name][k].append(seconds)
    same = runs[f"cached@{a.chunk}"] and all(
        runs[f"cached@{a.chunk}"][k][1] == runs[f"plain@{a.chunk}"][k][1] for k in range(a.turns))
    for k in range(a.turns):
        emit("PREFIX_TURN", turn=k + 1, prompt_tokens=a.system + (k + 1) * a.message + k * a.reply,
             **{f"ttft_ms[{n}]": round(1e3 * statistics.median(times[n][k]), 2) for n in arms},
             **{f"prefilled[{n}]": runs[n][k][2] for n in arms},
             same_tokens_default=runs["plain@default"][k][1] == runs[f"plain@{a.chunk}"][k][1])
    total = {n: sum(statistics.median(t) for t in times[n]) for n in arms}
    emit("PREFIX_CACHE", preset=a.preset, device=a.device, turns=a.turns, system=a.system, message=a.message,
         reply=a.reply, chunk=a.chunk, default_chunk=default_chunk, rows=a.rows,
         **{f"ttft_total_ms[{n}]": round(1e3 * v, 1) for n, v in total.items()},
         **{f"prefilled_total[{n}]": sum(r[2] for r in runs[n]) for n in arms},
         speedup_vs_default=round(total["plain@default"] / total[f"cached@{a.chunk}"], 2),
         speedup_vs_plain_chunk=round(total[f"plain@{a.chunk}"] / total[f"cached@{a.chunk}"], 2),
         cached_equals_plain=bool(same))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
