"""TP/EP over 2 GPUs: rank-local build, two-rank vs one-rank logits, eager and graph decode.

    python benchmarks/tp_bench.py --preset flash [--steps 16] [--compare]

Prints one JSON record per line (rank 0):
  TP_BUILD   build wall, GPU memory per rank (allocated after the build)
  TP_COMPARE (--compare) fp32 two-rank vs one-rank logits over prefill + decode steps
  TP_DECODE  eager and graph tok/s (median of rows of `--steps` sampled steps), same stream in both
             arms, digests equal on both ranks, reductions per token from the census
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import dsv4
from dsv4.receipts import emit, provenance


def rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def compare(preset: str, steps: int):
    ids = torch.randint(2, 129280, (16 + steps,), generator=torch.Generator().manual_seed(5)).tolist()
    two = dsv4.load(preset, device="cuda", dtype=torch.float32, ranks=2, seed=0)
    s2 = two.new_state(len(ids) + 1)
    a = [two.prefill(s2, ids[:16])] + [two.decode(s2, t) for t in ids[16:]]
    two.close()
    one = dsv4.load(preset, device="cuda", dtype=torch.float32, seed=0)
    s1 = one.new_state(len(ids) + 1)
    b = [one.prefill(s1, ids[:16])] + [one.decode(s1, t) for t in ids[16:]]
    errs = [rel(x, y) for x, y in zip(a, b)]
    emit("TP_COMPARE", preset=preset, dtype="float32", positions=len(errs), max_rel_err=max(errs),
         argmax_agree=sum(int(x.argmax() == y.argmax()) for x, y in zip(a, b)) / len(errs))
    del one
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="flash")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--compare", action="store_true")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    graph_arm = args.device == "cuda"
    if args.compare:
        compare(args.preset, 48)
    t = time.perf_counter()
    model = dsv4.load(args.preset, device=args.device, ranks=2, seed=0)
    build = time.perf_counter() - t
    emit("TP_BUILD", provenance(model.device, args.preset), ranks=2, build_s=round(build, 2),
         gib_per_rank=[round(m / 2**30, 2) for m in model.each("memory_allocated")], dtype=str(model.dtype))
    sp = dsv4.SamplingParams(temperature=1.0, seed=20260907)
    prompt = model.tokenizer.encode("The engine that people who run DeepSeek-V4 on their own GPUs reach for first.")
    cap = len(prompt) + args.steps + 8
    prefix = model.new_state(cap)
    logits = model.prefill(prefix, prompt)
    finite = bool(torch.isfinite(logits).all())
    first = model.draw(prefix, sp)
    eager, graph = model.new_state(cap), model.new_state(cap)
    graph.restore(prefix)
    if graph_arm:
        model.enable_replay(graph, sp)
        model.step(graph, first, sp)  # capture outside the rows
    walls = {"eager": [], "graph": []}
    streams, digests = {}, {}
    census0 = [torch.as_tensor(c) for c in model.each("census")]
    for row in range(args.rows * 2):
        arm = ("eager", "graph", "graph", "eager")[row % 4]
        state = eager if arm == "eager" else graph
        state.restore(prefix)
        carry, toks = first, []
        t = time.perf_counter()
        for _ in range(args.steps):
            carry = model.step(state, carry, sp)
            toks.append(carry)
        walls[arm].append(time.perf_counter() - t)
        streams.setdefault(arm, toks)
        digests.setdefault(arm, model.each("digests", state))
    census = [(torch.as_tensor(c) - c0).sum().item() for c, c0 in zip(model.each("census"), census0)]
    e, g = (args.steps / statistics.median(walls[a]) for a in ("eager", "graph"))  # graph = eager twin on CPU
    emit("TP_DECODE", preset=args.preset, ranks=2, finite_logits=finite, steps_per_row=args.steps,
         rows_per_arm=args.rows, eager_tok_s=round(e, 3), graph_tok_s=round(g, 3),
         same_stream=streams["eager"] == streams["graph"], same_digests_both_ranks=digests["eager"] == digests["graph"],
         reductions_per_token_per_rank=[c / (2 * args.rows * args.steps) for c in census],
         graph_arm=graph_arm, graph_census=model.graph_census(graph),
         timing_scope="model.step over 2 ranks (driver+worker)")
    model.close()


if __name__ == "__main__":
    main()
