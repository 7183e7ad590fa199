"""Offline batch generation (dsv4.generate_many) against the same prompts one by one (model.sample_tokens), in one
process: tokens a second of each, and every prompt's tokens compared (they must be equal: a batched row is the solo
step, bit for bit). Medians of --rounds rounds, the arms alternating.

    python benchmarks/offline_bench.py --preset mini --device cuda --prompts 32 --prompt-tokens 128 --max-tokens 64
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import dsv4
from dsv4.receipts import emit
from dsv4.serve.offline import generate_many


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    model = dsv4.load(a.preset, device=a.device)
    vocab = model.cfg.vocab_size
    prompts = [[(s * 7919 + 31 * j) % (vocab - 3) + 3 for j in range(a.prompt_tokens + s % 7)] for s in range(a.prompts)]
    samplings = [dsv4.SamplingParams(temperature=1.0, seed=s) for s in range(a.prompts)]
    eos = model.cfg.eos_token_id

    def batched():
        return [c.token_ids for c in generate_many(model, prompts, a.max_tokens, samplings,
                                                   max_num_seqs=a.max_num_seqs)]

    def one_by_one():
        out = []
        for p, s in zip(prompts, samplings):
            toks = []
            for t in model.sample_tokens(p, a.max_tokens, s):
                toks.append(t)
                if t == eos:
                    break
            out.append(toks)
        return out

    arms = {"generate_many": batched, "one_by_one": one_by_one}
    for fn in arms.values():  # compiles, captures
        fn()
    times = {n: [] for n in arms}
    results = {}
    for r in range(a.rounds):
        for name in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            if a.device == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            results[name] = arms[name]()
            if a.device == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t)
    same = results["generate_many"] == results["one_by_one"]
    tokens = sum(len(t) for t in results["one_by_one"])
    med = {n: statistics.median(v) for n, v in times.items()}
    emit("OFFLINE", preset=a.preset, device=a.device, prompts=a.prompts, prompt_tokens=a.prompt_tokens,
         max_tokens=a.max_tokens, max_num_seqs=a.max_num_seqs, rounds=a.rounds, tokens=tokens,
         **{f"seconds[{n}]": round(v, 3) for n, v in med.items()},
         **{f"tok_s[{n}]": round(tokens / v, 1) for n, v in med.items()},
         speedup=round(med["one_by_one"] / med["generate_many"], 2), same_tokens=same)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
