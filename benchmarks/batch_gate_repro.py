"""Replays the gate's batched check (dsv4/gate/batch.py) step by step in eager and in graph form and
reports where a batched row first differs from the same row alone (a GPU diagnostic).

    python benchmarks/batch_gate_repro.py --preset mini --ranks 2 --prime 256 --steps 24 --rows 4

The prefix is the gate's (its prompt text, first token by prefill, the rest one step at a time);
row b has seed 20260907 + b and joins at step b. Arms: "eager" (Model.step vs step_batch) and
"graph" (full-token graphs vs the batch graph). One record per arm:

  REPRO  arm, first mismatch (row, step, position, what differs) or null
"""

from __future__ import annotations

import argparse

import dsv4
from dsv4.gate.protocol import PROMPT_TEXT
from dsv4.receipts import emit
from dsv4.sampler import SamplingParams


def prefix_state(model, prime: int, capacity: int):
    text, ids = PROMPT_TEXT, model.tokenizer.encode(PROMPT_TEXT)
    while len(ids) < prime:
        text += PROMPT_TEXT
        ids = model.tokenizer.encode(text)
    ids = ids[:prime]
    state = model.new_state(capacity)
    model.prefill(state, ids[:1])
    for t in ids[1:]:
        model.decode(state, t)
    return state


def run(model, args, graph: bool) -> dict:
    capacity = args.capacity or args.prime + args.steps + 16
    prefix = prefix_state(model, args.prime, capacity)
    seed = 20260907
    first = model.draw(prefix, SamplingParams(temperature=1.0, seed=seed))
    samplings = [SamplingParams(temperature=1.0, seed=seed + b) for b in range(args.rows)]
    expected = []
    for b in range(args.rows):
        s = model.new_state(capacity)
        s.restore(prefix)
        if graph:
            model.enable_replay(s, samplings[b])
        carry, stream = first, []
        for _ in range(args.steps - b):
            carry = model.step(s, carry, samplings[b])
            stream.append((carry, model.logits_sha_all(s), model.digests_all(s)))
        expected.append(stream)
        s.discard()
    states = [model.new_state(capacity) for _ in range(args.rows)]
    for s in states:
        s.restore(prefix)
    carry = [first] * args.rows
    for step in range(args.steps):
        active = [b <= step for b in range(args.rows)]
        out = model.step_batch(states, carry, samplings, active, graph=graph)
        for b in range(args.rows):
            if not active[b]:
                continue
            tok, sha, dig = expected[b][step - b]
            got = (out[b], model.logits_sha_all(states[b]), model.digests_all(states[b]))
            if got != (tok, sha, dig):
                what = [name for name, x, y in zip(("token", "logits", "digests"), (tok, sha, dig), got) if x != y]
                detail = {}
                if "digests" in what:
                    detail = {"digest_fields_differing_per_rank": [[i for i, (p, q) in enumerate(zip(e, a)) if p != q]
                                                                   for e, a in zip(dig, got[2])]}
                return {"arm": "graph" if graph else "eager", "row": b, "step": step,
                        "position": states[b].host_pos, "differs": what, **detail}
            carry[b] = out[b]
    return {"arm": "graph" if graph else "eager", "mismatch": None, "steps": args.steps, "rows": args.rows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--prime", type=int, default=256)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--arms", default="graph,eager")
    ap.add_argument("--capacity", type=int, default=0,
                    help="the states' capacity (the gate's is prime + output + 8: 520 at the seed's sizes)")
    args = ap.parse_args()
    model = dsv4.load(args.preset, device=args.device, ranks=args.ranks)
    try:
        for arm in args.arms.split(","):
            emit("REPRO", run(model, args, arm == "graph"))
    finally:
        close = getattr(model, "close", None)
        if close:
            close()


if __name__ == "__main__":
    main()
