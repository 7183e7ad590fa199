"""The gate's timing: ABBA rows from one restored prefix (the same stream in both arms, checked
row by row) and the unscored NVTX profile window. `dsv4 bench` times its rows with the same
`arms` and `timed_steps`."""

from __future__ import annotations

import math
import time

import torch

from .checks import (capture_once, census, check_census, control_sha256, expect, identity, looped, same,
                     sha256_tokens)


def arms(rows: int, block: int, graph_first: bool = False) -> list[str]:
    """ABBA order in blocks: `block` rows of A, 2 x `block` of B, `block` of A, again; A is eager
    (graph with `graph_first`)."""
    return ["graph" if ((r // block) % 4 in (1, 2)) != graph_first else "eager" for r in range(rows)]


def sync(model):
    if model.device.type == "cuda":
        model.synchronize()


def timed_steps(model, state, first: int, steps: int, sampling) -> tuple[list[int], int, int]:
    """`steps` sampled steps from `first`, timed end to end: (the tokens fed in, the last token drawn, ns)."""
    carry, tokens = first, []
    sync(model)
    start = time.perf_counter_ns()
    for _ in range(steps):
        tokens.append(carry)
        carry = model.step(state, carry, sampling)
    sync(model)
    return tokens, carry, time.perf_counter_ns() - start


# ---- the gate's ABBA ---------------------------------------------------------


def abba(gate, prefix, first, inputs, expected_identity, schedule):
    """20 rows, eager A against graph B, each checked against the correctness stream (MEASURE), then
    REPLAY_SUMMARY."""
    expected = dict(tokens=sha256_tokens(inputs), identity=expected_identity)
    states = {"eager": gate.new_state(prefix), "graph": gate.new_state(prefix, graph=True)}
    walls = {"eager": 0, "graph": 0}
    rows = {"eager": 0, "graph": 0}
    for row, arm in enumerate(arms(20, 5, gate.args.reverse)):
        if arm == "graph" and not gate.graph_arm:
            gate.r.emit("MEASURE", {"row": row, "arm": "graph", "skipped": True,
                                    "reason": "no graph arm on this device", "eligible": False})
            continue
        walls[arm] += abba_row(gate, row, arm, states[arm], prefix, first, expected)
        rows[arm] += 1
    eager_tok_s = rows["eager"] * gate.output * 1e9 / walls["eager"]
    graph_tok_s = rows["graph"] * gate.output * 1e9 / walls["graph"] if rows["graph"] else None
    gate.r.emit("REPLAY_SUMMARY", {
        "rows": 20, "rows_per_arm": {"eager": rows["eager"], "graph": rows["graph"]}, "blocks": schedule,
        "eager_tok_s": eager_tok_s, "graph_tok_s": graph_tok_s,
        "delta_pct": 100.0 * (graph_tok_s / eager_tok_s - 1.0) if graph_tok_s else None,
        "speculative": False, "same_load": True, "recapture": False, "graph_arm": gate.graph_arm,
        "ranks": gate.world, "decision": "return to root; no automatic qualification or merge"})


def abba_row(gate, row: int, arm: str, active, prefix, first, expected) -> int:
    """One timed row of OUTPUT steps from the prefix, checked; emits MEASURE and returns its wall (ns)."""
    model, graph_row = gate.model, arm == "graph"
    active.restore(prefix)
    before_census = census(model)
    before_counts = gate.counts(active)
    tokens, _, elapsed = timed_steps(model, active, first, gate.output, gate.sampling)
    expect(gate.eos not in tokens, "early EOS row is not eligible", row=row)
    expect(not looped(tokens), "looped row is not eligible", row=row)
    same(expected["tokens"], sha256_tokens(tokens), "scored token stream", row=row, arm=arm)
    same(expected["identity"], identity(model, active), "scored final state", row=row, arm=arm)
    same([0] * gate.world, gate.words(), "refusal words", row=row)
    check_census(model, before_census, gate.output, row=row)
    after_counts = gate.counts(active)
    for rb, ra in zip(before_counts, after_counts, strict=True):
        same([gate.output, gate.output], [ra[0] - rb[0], ra[1] - rb[1]], "row replay counts", row=row)
    if graph_row:
        capture_once(model, active, row=row)
    final = expected["identity"][0]
    gate.r.emit("MEASURE", {
        "row": row, "arm": arm, "generated_tokens": gate.output, "decode_wall_ns": elapsed,
        "decode_tok_s": gate.output * 1e9 / elapsed, "timing_scope": "sample_plus_forward_envelope",
        "eligible": True, "looped": False, "generated_sha256": expected["tokens"],
        "final_logits_sha256": final[0], "final_cache_digest": final[1], "final_hidden_digest": final[2],
        "device_replays": after_counts, "captures": gate.captures(active) if graph_row else [0] * gate.world,
        "control_sha256": control_sha256(tokens, gate.prime, gate.sampling.seed), "speculative": False})
    if row == (0 if gate.args.reverse else 5) and graph_row:
        gate.r.emit("REPLAY_CENSUS", {"scope": "scored", "rank_segments": model.each("graph_census", active)})
    return elapsed


# ---- the profile window --------------------------------------------------------


def profile(gate, prompt, first):
    """An unscored 32-step window under NVTX ranges that crosses an HCA window boundary."""
    model = gate.model
    hca = gate.cfg.compress_rates["heavily_compressed_attention"]
    boundary = max(hca * math.ceil((gate.prime + 17) / hca), hca)
    start_pos = boundary - 16
    end_pos = start_pos + 32
    cap = end_pos + 8
    prefix = model.new_state(cap)
    model.prefill(prefix, prompt[:1])
    for t in prompt[1:]:
        model.decode(prefix, t)
    tape = list(prompt)
    carry = model.draw(prefix, gate.sampling)
    while prefix.host_pos < start_pos:
        expect(carry != gate.eos, "profile prefix early EOS")
        tape.append(carry)
        carry = model.step(prefix, carry, gate.sampling)
    gate.r.emit("PROFILE_PROTOCOL", {"start_position": start_pos, "end_position": end_pos,
                                     "crosses_hca": boundary, "prefix_sha256": sha256_tokens(tape),
                                     "profile_only": True, "scored": False, "nvtx": gate.graph_arm})
    oracle = None
    for graph_row in (False, True):
        if graph_row and not gate.graph_arm:
            gate.r.emit("PROFILE_ONLY", {"arm": "graph", "skipped": True, "scored": False})
            continue
        state = model.new_state(cap)
        state.restore(prefix)
        if graph_row:
            model.enable_replay(state, gate.sampling)
            model.step(state, carry, gate.sampling)  # capture outside the window
            state.discard()
            state.restore(prefix)
        before = census(model)
        tokens, c = profile_window(gate, state, carry, graph_row)
        same(end_pos, state.host_pos, "profile end position")
        check_census(model, before, 32, scope="profile")
        result = (tokens, c, identity(model, state))
        if graph_row:
            same(oracle, result, "profile arms differ")
            capture_once(model, state)
        else:
            oracle = result
        gate.r.emit("PROFILE_ONLY", {"arm": "graph" if graph_row else "eager", "steps": 32,
                                     "start_position": start_pos, "end_position": end_pos,
                                     "tokens_sha256": sha256_tokens(tokens), "identical": True, "scored": False,
                                     "capture_outside_window": True})
        state.discard()
    gate.r.note("PASS separate profile-only eager/replay windows; no scored rate")


def profile_window(gate, state, carry, graph_row: bool) -> tuple[list[int], int]:
    """32 steps, each in an NVTX range (on CUDA) inside the window's ranges."""
    model = gate.model
    tokens, c = [], carry
    sync(model)
    nvtx = torch.cuda.nvtx if gate.graph_arm else None
    if nvtx:
        nvtx.range_push("FULL_TOKEN_PROFILE")
        nvtx.range_push("FULL_TOKEN_REPLAY_WINDOW" if graph_row else "FULL_TOKEN_EAGER_WINDOW")
    for _ in range(32):
        if nvtx:
            nvtx.range_push("FULL_TOKEN_STEP")
        expect(c != gate.eos, "profile early EOS")
        tokens.append(c)
        c = model.step(state, c, gate.sampling)
        if nvtx:
            nvtx.range_pop()
    sync(model)
    if nvtx:
        nvtx.range_pop()
        nvtx.range_pop()
    return tokens, c
