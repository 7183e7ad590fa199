"""Where a graph-arm step's wall goes beyond its GPU span (mini on one GPU by default): the solo step of Model.step
with its full-token graph, its host parts timed one by one, and the same step with pinned host I/O, A/B.

Model.step's graph arm runs, per token: the checks and the token's host tensor, `state.input.copy_` from pageable
memory, the graph's replay (its launch), `out.tolist()` (the wait for the graph and the readback's copy) and the
settle. The GPU idles from the graph's end to the next graph's start: the readback's copy, the host's wake-up, the
Python of the next step, its input copy and its launch. This bench times each part with perf_counter and the replay's
GPU span with two CUDA events around it, for two forms of the host I/O:
  pageable: Model.step's own calls before session 40's pinned_io (dsv4.engine.CONFIG; its private _tokens and
            _settle, the same order);
  pinned:   the token written into a pinned host tensor and copied without blocking, the readback copied into a
            pinned host tensor and waited for by an event.
Both read the same graph and draw the same tokens (checked). Rows alternate ABBA; medians per token.

Prints STEP_HOST {"form", "wall_us", "gpu_us", "gap_us", "prepare_us", "input_us", "launch_us", "readback_us",
"settle_us", ...} per form and STEP_HOST_AB {"pinned_over_pageable"} (wall).
Usage: python benchmarks/step_host_gap.py [--preset mini] [--steps 64] [--rounds 4]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import dsv4
from dsv4.receipts import emit, provenance


def pageable_step(model, state, token: int, sp, t: dict, span: tuple) -> int:
    """Model.step's graph arm, part by part (dsv4.engine.Model.step)."""
    t0 = time.perf_counter()
    state.check_open()
    state.check_room(1)
    src = model._tokens([token], "step")
    t1 = time.perf_counter()
    state.input.copy_(src)
    t2 = time.perf_counter()
    span[0].record()
    out = state.replay.replay(state, sp)
    span[1].record()
    t3 = time.perf_counter()
    token_out, verdict = out.tolist()
    t4 = time.perf_counter()
    model._settle(state, verdict, 1)
    t5 = time.perf_counter()
    _record(t, (t0, t1, t2, t3, t4, t5))
    return int(token_out)


PARTS = ("prepare", "input", "launch", "readback", "settle")


def _record(t: dict, stamps: tuple) -> None:
    """The step's parts (PARTS, between consecutive perf_counter stamps) appended to t, in us."""
    for key, a, b in zip(PARTS, stamps, stamps[1:]):
        t.setdefault(key, []).append((b - a) * 1e6)


class Pinned:
    """The same step with its host I/O through pinned tensors: the token's copy queued without blocking, the
    readback's copy queued into pinned memory and waited for by an event."""

    def __init__(self, state):
        self.token = torch.empty(1, dtype=state.input.dtype, pin_memory=True)
        self.out = None
        self.event = torch.cuda.Event()

    def step(self, model, state, token: int, sp, t: dict, span: tuple) -> int:
        t0 = time.perf_counter()
        state.check_open()
        state.check_room(1)
        if not 0 <= token < model.cfg.vocab_size:
            raise ValueError(f"token {token} outside the vocabulary")
        self.token[0] = token
        t1 = time.perf_counter()
        state.input.copy_(self.token, non_blocking=True)
        t2 = time.perf_counter()
        span[0].record()
        out = state.replay.replay(state, sp)
        span[1].record()
        if self.out is None:
            self.out = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
        self.out.copy_(out, non_blocking=True)
        self.event.record()
        t3 = time.perf_counter()
        self.event.synchronize()
        token_out, verdict = self.out.tolist()
        t4 = time.perf_counter()
        model._settle(state, verdict, 1)
        t5 = time.perf_counter()
        _record(t, (t0, t1, t2, t3, t4, t5))
        return int(token_out)


def arguments(doc: str, rounds: int) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--prime", type=int, default=64)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=rounds)
    return ap.parse_args()


def primed(a: argparse.Namespace) -> tuple:
    """(model, sampling, prefix state, first token): the preset on CUDA, a prompt of a.prime random tokens prefilled
    into a state with room for a.steps more (benchmarks/launch_probe.py shares it)."""
    model = dsv4.load(a.preset, device="cuda", seed=0)
    sp = dsv4.SamplingParams(temperature=1.0, seed=20260907)
    prompt = torch.randint(2, model.cfg.vocab_size, (a.prime,), generator=torch.Generator().manual_seed(7)).tolist()
    prefix = model.new_state(a.prime + a.steps + 8)
    model.prefill(prefix, prompt)
    return model, sp, prefix, prompt[-1]


def main():
    a = arguments(__doc__, rounds=4)
    model, sp, prefix, first = primed(a)
    states = {}
    for form in ("pageable", "pinned"):
        states[form] = model.new_state(prefix.capacity)
        states[form].restore(prefix)
        model.enable_replay(states[form], sp)
        model.step(states[form], first, sp)  # the capture, outside the timed rows
    pinned = Pinned(states["pinned"])
    spans = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(a.steps)]
    rows = {form: [] for form in states}
    streams = {}
    for r in range(a.rounds):
        for form in ("pageable", "pinned") if r % 2 == 0 else ("pinned", "pageable"):
            state = states[form]
            state.restore(prefix)
            token, drawn, parts = first, [], {}
            torch.cuda.synchronize()
            begin = time.perf_counter()
            for i in range(a.steps):
                if form == "pageable":
                    token = pageable_step(model, state, token, sp, parts, spans[i])
                else:
                    token = pinned.step(model, state, token, sp, parts, spans[i])
                drawn.append(token)
            wall = (time.perf_counter() - begin) / a.steps * 1e6
            torch.cuda.synchronize()
            gpu = statistics.median(s.elapsed_time(e) * 1e3 for s, e in spans)
            streams.setdefault(form, drawn)
            if drawn != streams[form]:
                raise SystemExit(f"{form}: round {r} drew another stream than its round 0")
            rows[form].append({"wall_us": wall, "gpu_us": gpu, **{k: statistics.median(v) for k, v in parts.items()}})
    if streams["pageable"] != streams["pinned"]:
        raise SystemExit("the two forms drew different streams")
    result = {}
    for form, rs in rows.items():
        med = {k: round(statistics.median(r[k] for r in rs), 2) for k in rs[0]}
        med["gap_us"] = round(med["wall_us"] - med["gpu_us"], 2)
        result[form] = med
        emit("STEP_HOST", provenance(model.device, a.preset), form=form, steps=a.steps, rounds=a.rounds,
             rows_wall_us=[round(r["wall_us"], 1) for r in rs], **med)
    emit("STEP_HOST_AB", pinned_over_pageable=round(result["pinned"]["wall_us"] / result["pageable"]["wall_us"], 4),
         same_stream=True)


if __name__ == "__main__":
    main()
