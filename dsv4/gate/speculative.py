"""The gate's speculative check (`dsv4 gate --speculative K`): verify steps (Model.verify, K drafts a step; on
CUDA their graphs, replay.VerifyReplay) against the plain step loop from the same prefix, every byte compared on
every rank at each position a verify step commits to; then a refusal inside a verify step.

The drafts are the plain stream with every third one wrong, so the steps accept runs of drafts and reject others:
each verify step must yield exactly the plain stream's next tokens, and leave the state (logits, cache, hidden
state, position) the plain loop has after as many steps. The refusal, armed on a rank and layer inside a verify
step, must raise, quarantine the state and leave its cache, hidden state and position as they were (the rows the
step had written taken back). Its first GPU run: session 48 (mini on an H200, verify steps as graphs).
"""

from __future__ import annotations

import time

from ..engine import RefusalError
from .checks import expect, identity, same

SPECULATIVE_REFUSAL_CODE = 40088


def verified_vs_plain(gate, prefix, first: int) -> None:
    model, K = gate.model, gate.args.speculative
    steps = min(gate.output, 64)
    expected, state, carry = [], gate.new_state(prefix), first
    plain_start = time.perf_counter()
    for _ in range(steps):
        carry = model.step(state, carry, gate.sampling)
        expected.append((carry, identity(model, state)))
    plain_s = time.perf_counter() - plain_start
    state.discard()
    tokens = [t for t, _ in expected]
    state, carry, done, verifies, drafted, accepted = gate.new_state(prefix), first, 0, 0, 0, 0
    start = time.perf_counter()
    while done < steps:
        drafts = [t + (done + j) % 3 // 2 for j, t in enumerate(tokens[done:done + min(K, steps - done - 1)])]
        drafts = [d % gate.cfg.vocab_size for d in drafts]  # every third one wrong
        got = list(model.verify(state, carry, drafts, gate.sampling, graph=gate.graph_arm))
        verifies, drafted, accepted = verifies + 1, drafted + len(drafts), accepted + len(got) - 1
        where = dict(position=gate.prime + done, drafts=len(drafts))
        same(tokens[done:done + len(got)], got, "verify step's tokens equal the plain stream's", **where)
        done += len(got)
        for rank, (e, a) in enumerate(zip(expected[done - 1][1], identity(model, state), strict=True)):
            for field, x, y in zip(("logits_sha256", "cache_digest", "hidden_digest", "pos"), e, a, strict=True):
                same(x, y, f"verified state equals plain: {field}", rank=rank, **where)
        carry = got[-1]
    verified_s = time.perf_counter() - start
    expect(0 < accepted < drafted, "the drafts were accepted in part", accepted=accepted, drafted=drafted)
    gate.r.emit("SPECULATIVE_IDENTITY", {
        "drafts_a_step": K, "tokens": steps, "verify_steps": verifies, "drafted": drafted, "accepted": accepted,
        "tokens_equal_plain": True, "all_rank_cache_hidden_logits": True, "graph_arm": gate.graph_arm,
        "plain_tok_s": round(steps / plain_s, 2), "verified_tok_s": round(steps / verified_s, 2),
        "timing": "one pass each, identities computed between steps, drafts a third wrong (not a benchmark: see "
                  "benchmarks/speculative_bench.py)"})
    refused_verify(gate, state, carry)
    state.discard()


def refused_verify(gate, state, carry: int) -> None:
    """A refusal armed inside a verify step: it raises, the state is quarantined, its cache, hidden state and
    position are as before (the rows written in turn taken back)."""
    model = gate.model
    rank, layer = min(1, gate.world - 1), gate.L // 2
    before = identity(model, state)
    model.arm_refusal(layer, rank, SPECULATIVE_REFUSAL_CODE, "moe")
    error = None
    try:  # K drafts: on CUDA the graph the steps above captured replays it, the refusal armed on the device
        model.verify(state, carry, [carry] * gate.args.speculative, gate.sampling, graph=gate.graph_arm)
    except RefusalError as e:
        error = str(e)
    finally:
        model.reset_refusals()
    expect(error is not None and f"rank {rank} layer {layer} site moe" in error, "verify refusal raised", error=error)
    for r, (x, y) in enumerate(zip(before, identity(model, state), strict=True)):
        same(x[1:], y[1:], "refused verify changed the cache/hidden/pos", state_rank=r)
    expect(state.quarantine is not None, "refused verify quarantined")
    gate.r.emit("SPECULATIVE_REFUSAL", {"rank": rank, "layer": layer, "site": "moe", "state_unchanged": True,
                                        "quarantined": True, "graph_arm": gate.graph_arm})
