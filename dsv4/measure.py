"""Where a decode step's time and bytes go: the phase breakdown, bytes read per token, the roofline.

`graph_phases` times each phase (dsv4.profile) of a decode step inside a replayed CUDA graph, from
event nodes captured at every phase's enter and exit: the time between two consecutive events belongs
to the innermost phase open there (`attribute`), so the phases sum to the instrumented step, and the
plain graph of the same step, replayed beside it, gives the events' own cost. `eager_phases` does the
same for eager steps (CPU: perf_counter stamps).
`bytes_per_token` counts the weight bytes one token reads on this rank: every dense weight the
step touches, the routed experts this rank actually ran (the router's picks recorded over the
profiled steps), the vocab-parallel head; plus the state rows attention reads at the position.
`kernel_table` lists every kernel of a step by name with its calls and GPU time per token, against
the step's wall time (benchmarks/kernel_table.py: graph replay and eager, per rank).
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import statistics
import time

import torch

from . import profile
from .profile import ENTER, PREFIX, PHASES, elapsed_us, marking


def attribute(marks, start: float, end: float) -> dict:
    """One step's phases from its marks [(t, name, "enter" | "exit")], in order, times in us between start
    and end -> {phase: {"us", "intervals"}}. The time between two consecutive points goes to the innermost
    phase open there ("other" when none), so an inner phase's time is not its outer one's and the phases
    sum to end - start. intervals: the times a phase was entered; for "other", the stretches with no phase
    open (one before the first phase and one after each outermost exit)."""
    out: dict = {"other": {"us": 0.0, "intervals": 1}}
    stack: list[str] = []
    last = start
    for t, name, kind in marks:
        out[stack[-1] if stack else "other"]["us"] += t - last
        last = t
        if kind == ENTER:
            stack.append(name)
            out.setdefault(name, {"us": 0.0, "intervals": 0})["intervals"] += 1
        elif stack and stack[-1] == name:
            stack.pop()
            out["other"]["intervals"] += 0 if stack else 1
        else:
            raise ValueError(f"phase {name!r} exits while {stack[-1] if stack else 'none'!r} is the innermost open")
    if stack:
        raise ValueError(f"phase(s) {stack} never exit")
    out["other"]["us"] += end - last
    return out


def step_phases(log: list, span: tuple) -> dict:
    """attribute() of one step's stamps (dsv4.profile.timing's log), timed from span = (begin, end) stamps."""
    begin, end = span
    return attribute([(elapsed_us(begin, s), name, kind) for s, name, kind in log], 0.0, elapsed_us(begin, end))


def summarise(steps: list[dict], timed: list[float], plain: list[float], marks: int) -> dict:
    """Per phase over the timed steps: median and mean us per token and its intervals (the same in every
    step); the timed (instrumented) and the plain step's median, and the marks' cost as their difference."""
    names = [p for p in PHASES + ("other",) if p in steps[0]] + sorted(set(steps[0]) - set(PHASES) - {"other"})
    phases = {p: {"us": round(statistics.median(s[p]["us"] for s in steps), 1),
                  "us_mean": round(statistics.fmean(s[p]["us"] for s in steps), 2),
                  "intervals": steps[0][p]["intervals"]} for p in names}
    instrumented, bare = statistics.median(timed), statistics.median(plain)
    return {"phases_us_per_token": phases, "instrumented_us_per_token": round(instrumented, 1),
            "instrumented_us_mean": round(statistics.fmean(timed), 2), "plain_us_per_token": round(bare, 1),
            "overhead_us_per_token": round(instrumented - bare, 1), "marks_per_token": marks,
            "timed_tokens": len(steps)}


def graph_phases(model, state, start, token: int, sampling, replays: int, timed_replay, warmup: int = 2) -> dict:
    """The phase breakdown of this rank's decode step inside a replayed CUDA graph: a timed graph (event
    nodes at every phase's enter and exit: `timed_replay(marked=True)`, a dsv4.replay.TimedReplay of state)
    and a plain one of the same step (marked=False), both of `state` restored from `start` before every
    replay (so every replay is the same step, and state is left as start), interleaved ABBA, `warmup`
    rounds dropped. Every rank must call it alike: the graphs hold the step's collectives."""
    arms = {"plain": timed_replay(marked=False), "timed": timed_replay(marked=True)}
    steps: list[dict] = []
    saved = state.replay
    try:
        for i in range(warmup + replays):
            for arm in ("plain", "timed") if i % 2 == 0 else ("timed", "plain"):
                state.restore(start)
                state.replay = arms[arm]
                model.step(state, token, sampling)  # its readback waits for the replay: the events are done
                if arm == "timed" and i >= warmup:  # the graph's nodes re-record its events: read them now
                    steps.append(step_phases(arms[arm].marks, arms[arm].spans[-1]))
    finally:
        state.replay = saved
        state.restore(start)
    spans = {arm: [elapsed_us(*s) for s in r.spans[warmup:]] for arm, r in arms.items()}
    return summarise(steps, spans["timed"], spans["plain"], len(arms["timed"].marks))


def eager_phases(model, state, start, token: int, sampling, steps: int, warmup: int = 1) -> dict:
    """graph_phases for eager model.step calls (no graph: CPU, where the stamps are perf_counter and the step is
    synchronous): each step of `state` from `start`, timed whole, plain and under dsv4.profile.timing, ABBA."""
    clock = profile.clock(state.device)
    phases: list[dict] = []
    spans: dict = {"plain": [], "timed": []}
    marks = 0
    for i in range(warmup + steps):
        for arm in ("plain", "timed") if i % 2 == 0 else ("timed", "plain"):
            state.restore(start)
            model.synchronize()
            with profile.timing(state.device) if arm == "timed" else contextlib.nullcontext() as log:
                begin = clock()
                model.step(state, token, sampling)
                span = (begin, clock())
            model.synchronize()
            if i < warmup:
                continue
            spans[arm].append(elapsed_us(*span))
            if arm == "timed":
                phases.append(step_phases(log, span))
                marks = len(log)
    state.restore(start)
    return summarise(phases, spans["timed"], spans["plain"], marks)


def _innermost(ranges, starts, t, thread) -> str:
    """The phase of the latest-starting range that contains host time t on this thread (ranges nest)."""
    i = bisect.bisect_right(starts, t) - 1
    while i >= 0:
        start, end, name, th = ranges[i]
        if th == thread and end >= t:
            return name
        i -= 1
    return "other"


# ---- bytes ------------------------------------------------------------------

def _nbytes(w) -> int:
    if isinstance(w, torch.Tensor):
        return w.numel() * w.element_size()
    data, scale = w.data, w.scale
    return data.numel() * data.element_size() + (0 if scale is None else scale.numel() * scale.element_size())


def _walk(tree):
    if isinstance(tree, dict):
        for v in tree.values():
            yield from _walk(v)
    elif isinstance(tree, (tuple, list)):
        for v in tree:
            yield from _walk(v)
    elif tree is not None and (isinstance(tree, torch.Tensor) or hasattr(tree, "scale")):
        yield tree


@contextlib.contextmanager
def recording_routes():
    """Record the routed expert ids of every MoE call while inside (a benchmark's view of the router)."""
    from .model import moe

    picks: list[torch.Tensor] = []
    route = moe.route

    def recorded(*args, **kwargs):
        ids, weights = route(*args, **kwargs)
        picks.append(ids.detach().clone())
        return ids, weights

    moe.route = recorded
    try:
        yield picks
    finally:
        moe.route = route


def bytes_per_token(transformer, picks: list[torch.Tensor], steps: int, pos: int) -> dict:
    """Bytes one decode token reads on this rank: weights touched and the cache rows attention reads."""
    tf, cfg = transformer, transformer.cfg
    dense = expert_bytes = 0
    for L in tf.layers:
        experts = L["ffn"]["experts"]
        # the hash table is read one row per token: k ids
        dense += sum(_nbytes(w) for w in _walk({k: v for k, v in L["ffn"].items() if k not in ("experts", "tid2eid")}))
        dense += cfg.num_experts_per_tok * 8 if "tid2eid" in L["ffn"] else 0
        dense += sum(_nbytes(w) for w in _walk([L["attn"], L["hc"], L["attn_norm"], L["ffn_norm"]]))
        n = experts["w1"].data.shape[0]
        expert_bytes += sum(_nbytes(experts[k]) for k in ("w1", "w3", "w2")) // n  # one expert's three
    lo = tf.experts.start
    local = sum(int(((p >= lo) & (p < lo + tf.experts.stop - tf.experts.start)).sum()) for p in picks)
    per_expert = expert_bytes / len(tf.layers)
    routed = local / steps * per_expert
    head = _nbytes(tf.head_w) + _nbytes(tf.norm) + sum(_nbytes(w) for w in tf.hc_head)
    embed_row = tf.embed.shape[-1] * tf.embed.element_size()
    hd, isz = cfg.head_dim, torch.tensor([], dtype=tf.dtype).element_size()
    cache = 0
    for i in range(cfg.num_hidden_layers):
        m = cfg.compress_rate(i)
        cache += min(pos, cfg.sliding_window) * hd * isz
        if m and cfg.layer_types[i] == "compressed_sparse_attention":
            cache += min(cfg.index_topk, pos // m) * hd * isz + (pos // m) * cfg.index_head_dim * isz
        elif m:
            cache += (pos // m) * hd * isz
    return {"dense": dense, "routed_experts": round(routed), "local_expert_runs_per_token": round(local / steps, 2),
            "head": head, "embedding_row": embed_row, "cache": cache,
            "total": round(dense + routed + head + embed_row + cache)}


def copy_bandwidth(device, gib: float = 2.0, reps: int = 5) -> float:
    """Bytes per second of a device-to-device copy (read + written), median of `reps`."""
    if torch.device(device).type != "cuda":
        return float("nan")
    n = int(gib * 2**30)
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    times = []
    for _ in range(reps):
        torch.cuda.synchronize(device)
        t = time.perf_counter()
        b.copy_(a)
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t)
    del a, b
    return 2 * n / sorted(times)[len(times) // 2]


# ---- kernels ----------------------------------------------------------------

def short_kernel_name(name: str, width: int = 120) -> str:
    """A kernel's name without `void`, its parameter list and, past `width`, its template tail:
    `void at::native::elementwise_kernel<128, 4, ...>(int, ...)` -> `at::native::elementwise_kernel<128, 4, ...>`."""
    name = name.removeprefix("void ").strip()
    depth = 0
    for i in range(len(name) - 1, -1, -1):  # the parameter list is the last top-level (...) group
        depth += {")": 1, "(": -1}.get(name[i], 0)
        if depth == 0 and name[i] == "(" and name.endswith(")"):
            name = name[:i]
            break
    name = " ".join(name.split())
    return name if len(name) <= width else name[:width - 3] + "..."


def kernel_table(run_step, steps: int, device) -> dict:
    """Time `steps` calls of run_step() (one token each) plainly, then profile `steps` more ->
    per kernel name (shortened) its calls and GPU us per token, largest first, and the totals.

    On CUDA the rows are the device's activities (kernels, memcpy, memset): for a replayed graph its
    nodes, for an eager step its launches. kernel_us_per_token against wall_ms_per_token (timed without
    the profiler) is the share the GPU is busy; the rest is launch overhead and idle time. On CUDA each row
    also has its advance_us_per_token (`advances`: additive where durations overlap, as under PDL), with the
    idle and span per token and the last token's sequence. On CPU (a smoke run) the rows are the top-level
    torch ops and their host time.
    """
    cuda = torch.device(device).type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)  # noqa: E731
    sync()
    t = time.perf_counter()
    for _ in range(steps):
        run_step()
    sync()
    wall = time.perf_counter() - t
    acts = [torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=acts) as prof:
        t = time.perf_counter()
        for _ in range(steps):
            run_step()
        sync()
        profiled_wall = time.perf_counter() - t
    time_us, calls = collections.Counter(), collections.Counter()
    for e in prof.events():
        if cuda and e.device_type == torch.autograd.DeviceType.CUDA:
            us = e.time_range.elapsed_us()
        elif not cuda and e.cpu_parent is None and not e.is_async and e.device_type == torch.autograd.DeviceType.CPU:
            us = e.cpu_time_total
        else:
            continue
        name = short_kernel_name(e.name)
        time_us[name] += us
        calls[name] += 1
    total = sum(time_us.values())
    rows = [{"name": n, "calls_per_token": round(calls[n] / steps, 2), "us_per_token": round(us / steps, 2),
             "share": round(us / total, 4) if total else 0.0} for n, us in time_us.most_common()]
    timeline = {}
    if cuda:
        timeline = advances([(e.time_range.start, e.time_range.end, short_kernel_name(e.name)) for e in prof.events()
                             if e.device_type == torch.autograd.DeviceType.CUDA], steps)
        for row in rows:
            row["advance_us_per_token"] = timeline["advance_us_per_token"].get(row["name"], 0.0)
        del timeline["advance_us_per_token"]
        rows.sort(key=lambda r: -r["advance_us_per_token"])  # what the wall is made of, largest first
    return {"kernels": rows, **timeline, "distinct": len(rows),
            "kernels_per_token": round(sum(calls.values()) / steps, 2),
            "kernel_us_per_token": round(total / steps, 1), "wall_ms_per_token": round(wall / steps * 1e3, 3),
            "profiled_wall_ms_per_token": round(profiled_wall / steps * 1e3, 3),
            "busy_fraction": round(total / (wall * 1e6), 4) if wall > 0 else None,
            "scope": "CUDA activities (kernels, memcpy, memset) of model.step" if cuda
            else "top-level torch ops of model.step, host time (CPU smoke run)"}


def advances(spans: list[tuple[float, float, str]], steps: int) -> dict:
    """Where a stream's wall time went, additively, from its activities (start, end, name) in us: in launch
    (start) order each activity is charged the time by which it moved the stream's frontier (the latest end so
    far) forward, and a start past the frontier is idle time (the device waiting for the host). Under
    programmatic dependent launch a kernel starts before its predecessor ends and its duration includes that
    wait, so durations overlap and do not add up; advances do: their sum plus the idle time is the span.
    -> advance_us_per_token by name, idle and span us per token, and `sequence`: the last token's activities
    in order (name, start from the token's first start, duration, advance; us)."""
    spans = sorted(spans)
    advance: collections.Counter = collections.Counter()
    charged = []
    idle = 0.0
    frontier = spans[0][0] if spans else 0.0
    for start, end, name in spans:
        if start > frontier:
            idle += start - frontier
            frontier = start
        moved = max(0.0, end - frontier)
        advance[name] += moved
        charged.append(moved)
        frontier = max(frontier, end)
    per_step = len(spans) // steps if steps else 0
    last = list(zip(spans, charged))[len(spans) - per_step:] if per_step else []
    t0 = last[0][0][0] if last else 0.0
    sequence = [{"i": i, "name": name, "start_us": round(start - t0, 2), "us": round(end - start, 2),
                 "advance_us": round(moved, 2)} for i, ((start, end, name), moved) in enumerate(last)]
    return {"advance_us_per_token": {n: round(us / steps, 2) for n, us in advance.items()},
            "idle_us_per_token": round(idle / steps, 1),
            "span_us_per_token": round((frontier - spans[0][0]) / steps, 1) if spans else 0.0,
            "sequence": sequence}


# ---- prefill ----------------------------------------------------------------

# Finer ranges inside a prefill chunk's phases: (module, function, range). While a table is taken
# (`sub_phases`) each function runs inside its range, so a kernel counts in the innermost one; the
# forward's own phases (dsv4.profile) keep what none of these covers.
SUB_PHASES = (
    ("dsv4.model.attention", "linear", "attention.linear"),
    ("dsv4.model.attention", "grouped_linear", "attention.linear"),
    ("dsv4.model.attention", "_norm_rope", "attention.norm_rope"),
    ("dsv4.model.attention", "_attend", "attention.core"),
    ("dsv4.kernels.attention", "attention", "attention.core"),
    ("dsv4.model.compressor", "linear", "compressor.linear"),
    ("dsv4.model.attention", "compress", "compressor.pool"),
    ("dsv4.model.attention", "compress_pair", "compressor.pool"),
    ("dsv4.model.attention", "index_topk", "indexer.scores_topk"),
    ("dsv4.model.moe", "linear", "moe.linear"),
    ("dsv4.model.moe", "route", "moe.route"),
    ("dsv4.model.moe", "shared_expert", "moe.shared"),
    ("dsv4.model.moe", "grouped_experts", "moe.routed"),
    ("dsv4.kernels.moe", "routed", "moe.routed"),
    ("dsv4.model.moe_prefill", "dequant_stack", "moe.dequant"),
    ("dsv4.model.moe_prefill", "grouped_mm", "moe.grouped_mm"),
    ("dsv4.kernels.prefill_moe", "experts", "moe.grouped_fp4"),
)

# The groups of a prefill's time: each range (a phase or a sub-phase) belongs to one.
GROUPS = {"attention": "attention", "attention.norm_rope": "attention", "attention.core": "attention",
          "compressor": "compressor+indexer", "indexer": "compressor+indexer", "compressor.pool": "compressor+indexer",
          "indexer.scores_topk": "compressor+indexer",
          "attention.linear": "dense linears", "compressor.linear": "dense linears", "moe.linear": "dense linears",
          "moe": "moe", "moe.route": "moe", "moe.shared": "moe", "moe.routed": "moe", "moe.dequant": "moe",
          "moe.grouped_mm": "moe", "moe.grouped_fp4": "moe", "mhc": "mhc", "collective": "collectives",
          "head": "head", "commit": "commit"}


@contextlib.contextmanager
def sub_phases():
    """Wrap every SUB_PHASES function in its profiler range while inside (put back after)."""
    import functools
    import importlib

    saved = []

    def ranged(fn, name):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            with torch.profiler.record_function(PREFIX + name):
                return fn(*args, **kwargs)
        return run

    try:
        for module, attr, name in SUB_PHASES:
            mod = importlib.import_module(module)
            fn = getattr(mod, attr)
            saved.append((mod, attr, fn))
            setattr(mod, attr, ranged(fn, name))
        yield
    finally:
        for mod, attr, fn in reversed(saved):
            setattr(mod, attr, fn)


def prefill_table(run, reset, runs: int, device) -> dict:
    """A prefill's time by range and kernel. `reset()` puts the state back, `run()` prefills; one
    warm-up, `runs` timed plainly (the wall), `runs` more under the profiler with the sub-phase ranges.

    -> {"wall_s": median wall of a prefill, "walls_s", "kernel_us": summed GPU time of a prefill,
    "phases": {range: {"us", "kernels"}}, "groups": {group: us}, "kernels": [{"phase", "name",
    "calls", "us", "share"}] largest first}. Times are per prefill (all its chunks). On CUDA a
    kernel's own duration counts, in the innermost range open when it was launched; on CPU (a smoke
    run) the host time of the torch ops called from dsv4's code.
    """
    cuda = torch.device(device).type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)  # noqa: E731
    reset()
    run()
    walls = []
    for _ in range(runs):
        reset()
        sync()
        t = time.perf_counter()
        run()
        sync()
        walls.append(time.perf_counter() - t)
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with marking(), sub_phases(), torch.profiler.profile(activities=acts) as prof:
        for _ in range(runs):
            with torch.profiler.record_function(PREFIX + "reset"):
                reset()
            run()
        sync()
    phases, kernels = _attribute(prof.events(), cuda)
    phases.pop("reset", None)
    kernels = {key: v for key, v in kernels.items() if key[0] != "reset"}
    total = sum(us for us, _ in kernels.values())
    rows = [{"phase": p, "name": n, "calls": round(c / runs, 2), "us": round(us / runs, 1),
             "share": round(us / total, 4) if total else 0.0}
            for (p, n), (us, c) in sorted(kernels.items(), key=lambda kv: -kv[1][0])]
    groups = collections.Counter()
    for p, v in phases.items():
        groups[GROUPS.get(p, "other")] += v["us"] / runs
    return {"wall_s": round(sorted(walls)[len(walls) // 2], 4), "walls_s": [round(w, 4) for w in walls],
            "kernel_us": round(total / runs, 1),
            "phases": {p: {"us": round(v["us"] / runs, 1), "kernels": round(v["kernels"] / runs, 1)}
                       for p, v in sorted(phases.items(), key=lambda kv: -kv[1]["us"])},
            "groups": {g: round(us, 1) for g, us in groups.most_common()}, "kernels": rows,
            "scope": "CUDA kernels, innermost dsv4 range at launch" if cuda
            else "torch ops called from dsv4's code, host time (CPU smoke run)"}


def _attribute(events, cuda: bool) -> tuple[dict, dict]:
    """({range: {"us", "kernels"}}, {(range, kernel or op name): (us, calls)}) summed over the events."""
    ranges = sorted(((e.time_range.start, e.time_range.end, e.name[len(PREFIX):], e.thread) for e in events
                     if e.name.startswith(PREFIX)), key=lambda r: r[0])
    starts = [r[0] for r in ranges]
    phases: dict = {}
    kernels: dict = collections.defaultdict(lambda: (0.0, 0))
    for e in events:
        if e.name.startswith(PREFIX):
            continue
        if cuda:
            parts = [(k.name, k.duration) for k in e.kernels]
        elif e.cpu_parent is None or e.cpu_parent.name.startswith(PREFIX):
            parts = [(e.name, e.cpu_time_total)]
        else:
            continue
        if not parts:
            continue
        where = _innermost(ranges, starts, e.time_range.start, e.thread)
        slot = phases.setdefault(where, {"us": 0.0, "kernels": 0})
        for name, us in parts:
            slot["us"] += us
            slot["kernels"] += 1 if cuda else 0
            key = (where, short_kernel_name(name))
            kernels[key] = (kernels[key][0] + us, kernels[key][1] + 1)
    return phases, kernels
