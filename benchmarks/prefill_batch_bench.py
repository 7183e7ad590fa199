"""Several prompts' short prefill chunks in one forward (Model.prefill_batch) against one forward each.

    python benchmarks/prefill_batch_bench.py flash --ranks 2 [--states 16] [--tokens 63] [--runs 3]
    python benchmarks/prefill_batch_bench.py tiny --device cpu --states 4 --tokens 16 --runs 1   (CPU smoke)

For B = 1 and B = --states: B fresh states (pool slots, as the server's) each take their own --tokens-token
chunk of a different prompt, first one prefill per state (`Model.prefill`, the server before issue 12), then all
in one `Model.prefill_batch`; the median of --runs of each. Each grouped state's digest (every rank's) and
logits must equal its own prefill's: exit 1 when not. One record per line:

  PREFILL_BATCH_BUILD  preset, ranks, device, provenance, build wall
  PREFILL_BATCH_PROFILE / _KERNEL  with --profile N (1 rank): one grouped prefill's kernels, the N largest
  PREFILL_BATCH_HOST / _PY  with --pyprofile N (1 rank): one grouped prefill under cProfile (the host's side: where a
                       wave bound by its launches spends them), the N Python functions of most own time, with their
                       calls and cumulative time (a function's callees included)
  PREFILL_BATCH        states, tokens, one_by_one_s, grouped_s, speedup, grouped tok/s, equal (bytes alone ==
                       grouped), digest (of every state's bytes and logits: equal across runs that must keep the
                       bits), the GEMV kernels (DSV4_QGEMV, DSV4_DENSE_GEMV) and DSV4_KERNELS
  PREFILL_BATCH_AB     with --arm (1 rank): the --states wave under the defaults and under each arm's CONFIG
                       settings, interleaved round by round in this one process (a wave's time spreads by ~20 %
                       between processes, session 24 call 2: arms in separate processes cannot be told apart), each
                       arm's median, spread and digest

    python benchmarks/prefill_batch_bench.py mini --runs 7 --arm shared=moe.shared_prefill_tiles=1 \
        --arm wave=moe_tc.wave_tiles=1 --arm both=moe.shared_prefill_tiles=1,moe_tc.wave_tiles=1
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import time

import torch

import dsv4
from dsv4.receipts import emit, provenance


def prompts(states: int, tokens: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(tokens)
    return [torch.randint(2, vocab, (tokens,), generator=g).tolist() for _ in range(states)]


def fresh(states: list) -> None:
    for s in states:
        s.discard()  # zeroed: byte for byte a fresh state


def timed(model, run) -> float:
    model.synchronize()
    t = time.perf_counter()
    run()
    model.synchronize()
    return time.perf_counter() - t


def bench(model, slots, B: int, tokens: int, runs: int) -> dict:
    chunks = prompts(B, tokens, model.cfg.vocab_size)
    states = slots[:B]
    one, grouped, alone = [], [], None
    for _ in range(runs + 1):  # the first of each untimed: builds, allocator
        fresh(states)
        one.append(timed(model, lambda: [model.prefill(s, c, chunk_size=tokens) for s, c in zip(states, chunks)]))
        alone = [(model.digests_all(s), model.logits_sha_all(s)) for s in states]
        fresh(states)
        grouped.append(timed(model, lambda: model.prefill_batch(states, chunks)))
    equal = [(model.digests_all(s), model.logits_sha_all(s)) for s in states] == alone
    one_s, grouped_s = statistics.median(one[1:]), statistics.median(grouped[1:])
    return dict(states=B, tokens=tokens, one_by_one_s=round(one_s, 4), grouped_s=round(grouped_s, 4),
                speedup=round(one_s / grouped_s, 2), grouped_tok_s=round(B * tokens / grouped_s, 1), equal=equal,
                digest=hashlib.sha256(repr(alone).encode()).hexdigest()[:16],
                runs=runs, qgemv=os.environ.get("DSV4_QGEMV", "v2"), dense_gemv=os.environ.get("DSV4_DENSE_GEMV", "v2"),
                kernels=os.environ.get("DSV4_KERNELS", "auto"))


def parse_arm(spec: str) -> tuple[str, list]:
    """NAME=module.key=value[,module.key=value...] -> (NAME, [(dsv4.kernels.<module>.CONFIG, key, value)]; a module
    that is not a kernel module is dsv4.<module>, e.g. layout): the value takes the type of the key's current value
    (bool from 0/1, int, float, or the string)."""
    import importlib

    name, _, sets = spec.partition("=")
    if not name or not sets:
        raise SystemExit(f"--arm {spec!r}: expected NAME=module.key=value[,module.key=value]")
    out = []
    for item in sets.split(","):
        target, _, raw = item.partition("=")
        module, _, key = target.partition(".")
        try:
            config = importlib.import_module(f"dsv4.kernels.{module}").CONFIG
        except ModuleNotFoundError:
            config = importlib.import_module(f"dsv4.{module}").CONFIG
        if key not in config:
            raise SystemExit(f"--arm {spec!r}: dsv4.kernels.{module}.CONFIG has no key {key!r}")
        now = config[key]
        value = raw in ("1", "true", "True") if isinstance(now, bool) else type(now)(raw) if now is not None else raw
        out.append((config, key, value))
    return name, out


def ab(model, slots, args) -> None:
    """The --states wave under the defaults and each --arm, interleaved: round r times every arm once (round 0
    untimed: each arm's compiles), so that a drift of the machine falls on every arm alike."""
    arms = [("defaults", [])] + [parse_arm(spec) for spec in args.arm]
    chunks = prompts(args.states, args.tokens, model.cfg.vocab_size)
    states = slots[:args.states]
    times: dict = {name: [] for name, _ in arms}
    digests: dict = {}
    for r in range(args.runs + 1):
        for name, sets in arms:
            saved = [(config, key, config[key]) for config, key, _ in sets]
            try:
                for config, key, value in sets:
                    config[key] = value
                fresh(states)
                seconds = timed(model, lambda: model.prefill_batch(states, chunks))
                if r == 0:
                    got = [(model.digests_all(s), model.logits_sha_all(s)) for s in states]
                    digests[name] = hashlib.sha256(repr(got).encode()).hexdigest()[:16]
                else:
                    times[name].append(seconds)
            finally:
                for config, key, value in saved:
                    config[key] = value
    for name, sets in arms:
        t = times[name]
        emit("PREFILL_BATCH_AB", arm=name, settings={f"{k}": v for _, k, v in sets}, states=args.states,
             tokens=args.tokens, runs=args.runs, grouped_s=round(statistics.median(t), 4), min_s=round(min(t), 4),
             max_s=round(max(t), 4), vs_defaults=round(statistics.median(times["defaults"]) / statistics.median(t), 3),
             digest=digests[name], digest_as_defaults=digests[name] == digests["defaults"])


def profile(model, slots, args) -> None:
    """Where one grouped prefill's time goes: its kernels by name (PREFILL_BATCH_KERNEL), their sum against the
    wall time (PREFILL_BATCH_PROFILE: a busy fraction well below 1 means the host's launches bound it)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    chunks = prompts(args.states, args.tokens, model.cfg.vocab_size)
    states = slots[:args.states]
    fresh(states)
    cuda = model.device.type == "cuda"  # on CPU the rows are torch ops with their own host time
    with torch_profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        wall = timed(model, lambda: model.prefill_batch(states, chunks))
    totals: dict[str, list] = {}
    kind = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    for e in prof.events():
        if e.device_type == kind:
            row = totals.setdefault(e.name[:90], [0, 0.0])
            row[0] += 1
            row[1] += e.device_time_total if cuda else e.self_cpu_time_total
    kernel_us = sum(us for _, us in totals.values())
    emit("PREFILL_BATCH_PROFILE", states=args.states, tokens=args.tokens, wall_s=round(wall, 4),
         kernels=sum(n for n, _ in totals.values()), kernel_us=round(kernel_us, 1),
         busy_fraction=round(kernel_us / 1e6 / wall, 3))
    for name, (n, us) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:args.profile]:
        emit("PREFILL_BATCH_KERNEL", name=name, calls=n, us=round(us, 1), share=round(us / kernel_us, 4))


def pyprofile(model, slots, args) -> None:
    """The host's side of one grouped prefill: cProfile's functions by own time (PREFILL_BATCH_PY), the wall with and
    without the profiler (PREFILL_BATCH_HOST: its overhead scales every function alike)."""
    import cProfile
    import pstats

    chunks = prompts(args.states, args.tokens, model.cfg.vocab_size)
    states = slots[:args.states]
    fresh(states)
    bare = timed(model, lambda: model.prefill_batch(states, chunks))
    fresh(states)
    prof = cProfile.Profile()
    wall = timed(model, lambda: prof.runcall(model.prefill_batch, states, chunks))
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (primitive calls, calls, own s, cumulative s, callers)
    own = sum(v[2] for v in stats.values())
    emit("PREFILL_BATCH_HOST", states=args.states, tokens=args.tokens, wall_s=round(bare, 4),
         profiled_wall_s=round(wall, 4), functions=len(stats), own_s=round(own, 4))
    for (file, line, name), (_, calls, tt, ct, _) in sorted(stats.items(), key=lambda kv: -kv[1][2])[:args.pyprofile]:
        where = f"{os.path.relpath(file) if file.startswith('/') else file}:{line}"
        emit("PREFILL_BATCH_PY", function=name[:60], where=where[-70:], calls=calls, own_ms=round(tt * 1e3, 2),
             cum_ms=round(ct * 1e3, 2), share=round(tt / own, 4))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("preset")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--states", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=63, help="chunk length (a 64-token prompt prefills 63)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--profile", type=int, default=0,
                    help="1 rank: the --profile largest kernels of one grouped prefill of --states states (torch profiler)")
    ap.add_argument("--pyprofile", type=int, default=0,
                    help="1 rank: the --pyprofile Python functions of most own time in one grouped prefill (cProfile)")
    ap.add_argument("--arm", action="append", default=[],
                    help="1 rank, repeatable: NAME=module.key=value[,module.key=value]: the wave with those "
                         "dsv4.kernels.<module>.CONFIG settings, timed interleaved with the defaults (PREFILL_BATCH_AB)")
    args = ap.parse_args()
    if args.arm and args.ranks != 1:
        raise SystemExit("--arm sets this process's CONFIG: 1 rank only")
    for spec in args.arm:
        parse_arm(spec)  # a bad arm fails before the model is built
    t = time.perf_counter()
    model = dsv4.load(args.preset, device=args.device, ranks=args.ranks)
    model.each("pool_states", args.states)
    slots = [model.new_state(args.tokens + 8) for _ in range(args.states)]
    model.each("pool_states", 0)
    emit("PREFILL_BATCH_BUILD", ranks=args.ranks, build_s=round(time.perf_counter() - t, 1),
         **provenance(args.device, args.preset))
    ok = True
    for B in sorted({1, args.states}):
        record = bench(model, slots, B, args.tokens, args.runs)
        ok &= record["equal"]
        emit("PREFILL_BATCH", preset=args.preset, ranks=args.ranks, **record)
    if args.arm:
        ab(model, slots, args)
    if args.profile and args.ranks == 1:
        profile(model, slots, args)
    if args.pyprofile and args.ranks == 1:
        pyprofile(model, slots, args)
    if args.ranks > 1:
        model.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
