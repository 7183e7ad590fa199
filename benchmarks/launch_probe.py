"""Why a graph-arm step's replay() costs 33-39 us of host time in Model.step's loop (benchmarks/step_host_gap.py,
session 42 call 1) where graph_launch_bench timed the same graph's replay at 5.5 us with the GPU idle.

One mini state's full-token graph, in one process; each form runs `steps` committed steps from the same prefix
(restored before each row), rows alternating, and times the host's parts of a step with perf_counter:

  step:        Model.step's graph arm as it is (pinned token in, replay, pinned readback, stream sync, settle);
  sync_first:  the same with torch.cuda.synchronize() right before the replay (the stream idle, as in
               graph_launch_bench);
  no_put:      the same without the token's copy (the graph reads the previous token: another stream, timed only);
  event_wait:  the readback waited for by an event (record, synchronize) rather than the stream;
  spin_wait:   the readback waited for by polling an event (query() in a loop);
  delay:       a 200 us busy wait before the put (the GPU idle longer, the host hot);
  mapped:      the readback written by a small Triton kernel launched after the replay straight into pinned host
               memory (UVA), then a step number stored with release semantics at system scope; the host spins on
               that number (no copy, no stream sync): what a graph whose readback kernel wrote host memory would pay.

Per form: the median over steps of each part (put, replay, copy, wait, tolist, settle) and the wall per step.
Prints LAUNCH_PROBE {"form", "wall_us", "parts_us": {...}} per form, and graph_launch_bench's idle / queued replay
of the same graph in this process (LAUNCH_PROBE_IDLE).
Usage: python benchmarks/launch_probe.py [--steps 64] [--rounds 3]
"""

from __future__ import annotations

import statistics
import time

import torch

from dsv4.receipts import emit, provenance

try:
    from benchmarks.step_host_gap import arguments, primed
except ImportError:  # run as a script without the repository's root on the path
    from step_host_gap import arguments, primed

FORMS = ("step", "sync_first", "no_put", "event_wait", "spin_wait", "delay", "mapped")

try:
    import triton
    import triton.language as tl

    @triton.jit
    def _mapped_kernel(src_ptr, dst_ptr, seq_ptr, seq):
        i = tl.arange(0, 2)
        tl.store(dst_ptr + i, tl.load(src_ptr + i))
        tl.debug_barrier()
        tl.atomic_xchg(seq_ptr, seq, sem="release", scope="sys")
except ImportError:  # pragma: no cover - a GPU bench
    triton = None


def run_form(form: str, model, state, sp, io, first: int, steps: int, parts: dict) -> tuple[float, list]:
    graph, out = state.replay.graph, state.replay.out
    host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
    event = torch.cuda.Event()
    stream = torch.cuda.current_stream()
    seq = torch.zeros(1, dtype=torch.int64, pin_memory=True)
    seq_view, host_view = seq.numpy(), host.numpy()
    token, drawn = first, []
    clock = time.perf_counter
    torch.cuda.synchronize()
    begin = clock()
    for n in range(1, steps + 1):
        if form == "delay":
            until = clock() + 200e-6
            while clock() < until:
                pass
        t0 = clock()
        state.check_open()
        state.check_room(1)
        if form != "no_put":
            io.put(state.input, token)
        t1 = clock()
        if form == "sync_first":
            torch.cuda.synchronize()
        t1b = clock()
        graph.replay()
        t2 = clock()
        if form == "mapped":
            _mapped_kernel[(1,)](out, host, seq, n)
        else:
            host.copy_(out, non_blocking=True)
        if form in ("event_wait", "spin_wait"):
            event.record()
        t3 = clock()
        if form == "event_wait":
            event.synchronize()
        elif form == "mapped":
            while seq_view[0] != n:
                pass
        elif form == "spin_wait":
            while not event.query():
                pass
        else:
            stream.synchronize()
        t4 = clock()
        token_out, verdict = host_view.tolist()
        t5 = clock()
        model._settle(state, verdict, 1)
        t6 = clock()
        token = int(token_out)
        drawn.append(token)
        for key, a, b in (("put", t0, t1), ("replay", t1b, t2), ("copy", t2, t3), ("wait", t3, t4),
                          ("tolist", t4, t5), ("settle", t5, t6)):
            parts.setdefault(key, []).append((b - a) * 1e6)
    wall = (clock() - begin) / steps * 1e6
    torch.cuda.synchronize()
    if form == "mapped":
        del seq_view, host_view
    return wall, drawn


def main():
    a = arguments(__doc__, rounds=3)
    model, sp, prefix, first = primed(a)
    state = model.new_state(prefix.capacity)
    state.restore(prefix)
    model.enable_replay(state, sp)
    model.step(state, first, sp)  # the capture, outside the timed rows
    io = model._io(state.device)
    where = provenance(model.device, a.preset)
    def section(forms, label):
        rows = {f: [] for f in forms}
        parts = {f: {} for f in forms}
        streams, failed = {}, {}
        for r in range(a.rounds):
            for form in forms if r % 2 == 0 else tuple(reversed(forms)):
                if form in failed:
                    continue
                state.restore(prefix)
                try:
                    wall, drawn = run_form(form, model, state, sp, io, first, a.steps, parts[form])
                except Exception as e:  # the mapped form needs Triton to take a pinned host tensor: said, not fatal
                    failed[form] = f"{type(e).__name__}: {e}"[:300]
                    torch.cuda.synchronize()
                    continue
                rows[form].append(wall)
                if form != "no_put":
                    streams.setdefault("ref", drawn)
                    if drawn != streams["ref"]:
                        raise SystemExit(f"{form}: round {r} drew another stream")
        for form, why in failed.items():
            emit("LAUNCH_PROBE", where, section=label, form=form, failed=why)
        for form in (f for f in forms if f not in failed):
            emit("LAUNCH_PROBE", where, section=label, form=form, steps=a.steps, rounds=a.rounds,
                 wall_us=round(statistics.median(rows[form]), 2), rows_wall_us=[round(w, 1) for w in rows[form]],
                 parts_us={k: round(statistics.median(v), 2) for k, v in parts[form].items()},
                 parts_p90_us={k: round(sorted(v)[int(0.9 * len(v))], 2) for k, v in parts[form].items()})

    section(FORMS[:-1], "host_forms")
    # graph_launch_bench's timing of the same graph, in this process (each replay commits: the state has room)
    graph = state.replay.graph
    idle, queued = [], []
    for _ in range(2):
        state.restore(prefix)
        for _ in range(16):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            graph.replay()
            idle.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        state.restore(prefix)
        for _ in range(16):
            t0 = time.perf_counter()
            graph.replay()
            queued.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
    emit("LAUNCH_PROBE_IDLE", where, idle_host_us=round(statistics.median(idle), 2),
         queued_host_us=round(statistics.median(queued), 2))
    # last: a kernel writing host memory could take the context down with it
    section(("step", "mapped"), "mapped")


if __name__ == "__main__":
    main()
