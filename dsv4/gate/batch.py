"""The gate's batched check (`dsv4 gate --batch B`): B sequences decoded together in one batched
step (Model.step_batch; on CUDA its captured graph) against each decoded alone (its full-token
graph on CUDA), every byte compared each step; then a refusal inside a batched step. Then the same rows
through the pipelined calls a server makes (each step launched before the previous one settles), and a refusal
with the next step launched behind it.

Row b has its own seed (the gate's + b) and joins the batch at step b, so the rows sit at
different positions and the step runs with inactive rows first; each row must equal its solo
stream token for token, with the same logits, cache, hidden state and position on every rank.
"""

from __future__ import annotations

import time

from ..engine import RefusalError, StepHeld
from ..sampler import SamplingParams
from .checks import expect, identity, same

BATCH_REFUSAL_CODE = 40077


def batched_vs_solo(gate, prefix, first: int) -> None:
    model, B = gate.model, gate.args.batch
    steps = min(gate.output, 64) + B
    samplings = [SamplingParams(temperature=1.0, seed=(gate.sampling.seed + b) % 2**64) for b in range(B)]
    expected, solo_s = [], 0.0
    for b in range(B):
        state = gate.new_state(prefix)
        if gate.graph_arm:
            model.enable_replay(state, samplings[b])
        carry, stream = first, []
        start = time.perf_counter()
        for _ in range(steps - b):
            carry = model.step(state, carry, samplings[b])
            stream.append((carry, identity(model, state)))
        solo_s += time.perf_counter() - start
        expected.append(stream)
        state.discard()

    states = [gate.new_state(prefix) for _ in range(B)]
    carry, batched_s = [first] * B, 0.0
    for step in range(steps):
        active = [b <= step for b in range(B)]
        start = time.perf_counter()
        out = model.step_batch(states, carry, samplings, active, graph=gate.graph_arm)
        batched_s += time.perf_counter() - start
        for b in range(B):
            if not active[b]:
                same(-1, out[b], "inactive batch row read", row=b, step=step)
                continue
            token, ident = expected[b][step - b]
            where = dict(row=b, step=step, position=states[b].host_pos)
            same(token, out[b], "batched token equals solo", **where)
            for rank, (e, a) in enumerate(zip(ident, identity(model, states[b]), strict=True)):
                for field, x, y in zip(("logits_sha256", "cache_digest", "hidden_digest", "pos"), e, a, strict=True):
                    same(x, y, f"batched state equals solo: {field}", rank=rank, **where)
            carry[b] = out[b]
    tokens = sum(steps - b for b in range(B))
    captures = model.each("batch_captures") if gate.graph_arm else None
    if gate.graph_arm:
        same([1] * gate.world, captures, "batch graph captured once")
    gate.r.emit("BATCH_IDENTITY", {
        "rows": B, "steps": steps, "tokens": tokens, "all_rank_cache_hidden_logits": True,
        "graph_arm": gate.graph_arm, "batch_captures": captures,
        "solo_tok_s": round(tokens / solo_s, 2), "batched_tok_s": round(tokens / batched_s, 2),
        "timing": "one pass each, identities computed between steps (not a benchmark: see dsv4 bench)"})
    refused_batch(gate, states, carry, samplings)
    for s in states:
        s.discard()
    pipelined_vs_solo(gate, prefix, first, samplings, expected, steps)


def pipelined_vs_solo(gate, prefix, first: int, samplings, expected, steps: int) -> None:
    """The same rows through the pipelined calls a server's rounds make (Model.step_batch_launch: step N+1
    launched before step N settles, each continuing row fed its last draw on the device): every token equals its
    solo stream's, and after the last step every rank's logits, cache, hidden state and position too. Then a
    refusal in a step with the next one launched behind it: neither commits anything, the first quarantines."""
    model, B = gate.model, gate.args.batch
    captures_before = model.each("batch_captures") if gate.graph_arm else None
    states = [gate.new_state(prefix) for _ in range(B)]
    launched: list[list[bool]] = []
    start = time.perf_counter()
    for step in range(steps + 1):
        if step < steps:
            active = [b <= step for b in range(B)]
            feed = [b < step for b in range(B)]  # a row's first step takes the prompt's token from the host
            model.step_batch_launch(states, [None if f else first for f in feed], samplings, active, feed,
                                    graph=gate.graph_arm)
            launched.append(active)
        if step:
            out = model.step_batch_settle()
            for b in range(B):
                if launched[step - 1][b]:
                    same(expected[b][step - 1 - b][0], out[b], "pipelined token equals solo", row=b, step=step - 1)
                else:
                    same(-1, out[b], "inactive pipelined row read", row=b, step=step - 1)
    pipelined_s = time.perf_counter() - start
    for b in range(B):
        for rank, (e, a) in enumerate(zip(expected[b][-1][1], identity(model, states[b]), strict=True)):
            for field, x, y in zip(("logits_sha256", "cache_digest", "hidden_digest", "pos"), e, a, strict=True):
                same(x, y, f"pipelined state equals solo at the end: {field}", rank=rank, row=b)
    captures = None
    if gate.graph_arm:
        captures = model.each("batch_captures")
        same([c + 1 for c in captures_before], captures, "pipelined batch graph captured once")
    tokens = sum(steps - b for b in range(B))
    gate.r.emit("BATCH_PIPELINED", {
        "rows": B, "steps": steps, "tokens": tokens, "tokens_equal_solo": True, "all_rank_final_state_equal": True,
        "graph_arm": gate.graph_arm, "batch_captures": captures, "pipelined_tok_s": round(tokens / pipelined_s, 2),
        "timing": "one pass, tokens compared between steps (not a benchmark: see benchmarks/serve_host.py)"})
    refused_pipelined(gate, states, samplings)
    for s in states:
        s.discard()


def refused_pipelined(gate, states, samplings) -> None:
    """Step N refuses with step N+1 already launched: N raises RefusalError and quarantines every row, N+1 commits
    nothing (StepHeld); every row's cache, hidden state and position as before N."""
    model, B = gate.model, len(states)
    rank, layer = min(1, gate.world - 1), gate.L // 2
    before = [identity(model, s) for s in states]
    model.arm_refusal(layer, rank, BATCH_REFUSAL_CODE, "attention")
    outcomes = []
    try:
        for _ in range(2):
            model.step_batch_launch(states, [None] * B, samplings, feed=[True] * B, graph=gate.graph_arm)
        for _ in range(2):
            try:
                model.step_batch_settle()
                outcomes.append("committed")
            except (RefusalError, StepHeld) as e:
                outcomes.append(f"{type(e).__name__}: {e}")
    finally:
        model.reset_refusals()
    expect(outcomes[0].startswith("RefusalError") and f"rank {rank} layer {layer} site attention" in outcomes[0],
           "pipelined refusal raised", outcomes=outcomes)
    expect(outcomes[1].startswith("StepHeld"), "the step launched behind a refusal held", outcomes=outcomes)
    for b, s in enumerate(states):
        for r, (x, y) in enumerate(zip(before[b], identity(model, s), strict=True)):
            same(x[1:], y[1:], "refused pipelined steps changed a row's cache/hidden/pos", row=b, state_rank=r)
        expect(s.quarantine is not None, "refused pipelined row quarantined", row=b)
    gate.r.emit("BATCH_PIPELINED_REFUSAL", {"rank": rank, "layer": layer, "site": "attention", "rows": B,
                                            "rows_unchanged": True, "rows_quarantined": True, "next_step_held": True,
                                            "graph_arm": gate.graph_arm})


def refused_batch(gate, states, carry, samplings) -> None:
    """A refusal armed inside the batched step: no row commits, every row is quarantined."""
    model = gate.model
    rank, layer = min(1, gate.world - 1), gate.L // 2
    before = [identity(model, s) for s in states]
    model.arm_refusal(layer, rank, BATCH_REFUSAL_CODE, "moe")
    error = None
    try:
        model.step_batch(states, carry, samplings, graph=gate.graph_arm)
    except RefusalError as e:
        error = str(e)
    finally:
        model.reset_refusals()
    expect(error is not None and f"rank {rank} layer {layer} site moe" in error, "batched refusal raised",
           error=error)
    for b, s in enumerate(states):
        for r, (x, y) in enumerate(zip(before[b], identity(model, s), strict=True)):
            same(x[1:], y[1:], "refused batch changed a row's cache/hidden/pos", row=b, state_rank=r)
        expect(s.quarantine is not None, "refused batch row quarantined", row=b)
    gate.r.emit("BATCH_REFUSAL", {"rank": rank, "layer": layer, "site": "moe", "rows": len(states),
                                  "rows_unchanged": True, "rows_quarantined": True, "graph_arm": gate.graph_arm})
