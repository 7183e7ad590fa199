"""What a verify step costs and yields (dsv4.speculative), against the plain step, in one process.

From one prefix: the plain eager step loop (model.step; on CUDA also its replayed graph, for scale) gives the
reference stream; then, for each k, verify steps whose drafts are that stream (every draft accepted: k + 1 tokens
a step, the machinery's best case) and drafts that are all wrong (one token a step: the verify step's cost with
nothing gained); with --mtp also verify steps drafted by the model's MTP layer (Model.verify_draft: random weights
draft badly, so this arm is the layer's cost: its forward on every row, and k drafts). Rounds in ABBA order; each row
`steps` tokens (every verify step has k drafts, a graph arm's every step its graph; the last step's tokens past
`steps` are not counted: until session 50 the last steps ran eagerly with fewer drafts, which likely made the all-wrong
graph arms look slow: session 49's 5.1 ms a step). Prints SPECULATIVE_ROW per row and SPECULATIVE per
arm: median tok/s, tokens and milliseconds a step, the ratio to the plain eager loop measured in the same run, and
whether the arm's stream is the plain one (it must be: the benchmark fails otherwise). On CUDA set
DSV4_SPECULATIVE=1 (verify has not run on a GPU before: this script is its first run there).

    python benchmarks/speculative_bench.py --preset mini --k 1 --k 3 --steps 32 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import dsv4
from dsv4.kernels import undo as fused_undo
from dsv4.layout import CONFIG as LAYOUT
from dsv4.receipts import emit, provenance

try:
    from benchmarks.rank_proxy import label, load
except ImportError:  # run as a script without the repository's root on the path
    from rank_proxy import label, load


def sync(model):
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)


def plain(model, state, token, steps, sampling):
    sync(model)
    t = time.perf_counter()
    out = []
    for _ in range(steps):
        token = model.step(state, token, sampling)
        out.append(token)
    return out, time.perf_counter() - t


def verified(model, state, token, steps, sampling, drafts_of, k, graph=False):
    """steps tokens by verify steps of k drafts each (the last step's tokens past `steps` dropped: every step of a
    graph arm replays its graph, none runs eagerly); drafts_of(done, k): the drafts after `done` tokens (None: the
    MTP layer's, Model.verify_draft) -> (the first `steps` tokens, seconds, verify steps)."""
    sync(model)
    t = time.perf_counter()
    out, n, drafted = [], 0, []
    while len(out) < steps:
        room = k
        full = graph  # a graph holds one row count: every step has k drafts
        if drafts_of is None:
            got, drafted = model.verify_draft(state, token, list(drafted)[:room], sampling, k=k, graph=full)
        else:
            got = model.verify(state, token, drafts_of(len(out), room), sampling, graph=full)
        out += got
        token, n = got[-1], n + 1
    return out[:steps], time.perf_counter() - t, n


def profile(model, prefix, first, sp, reference, k, where, steps=4):
    """Eager plain steps and eager verify steps of k wrong drafts (each one token), `steps` of each under
    torch.profiler: kernels a step, their device microseconds a step, and the 25 most launched names (on CPU, a smoke
    run: torch's ops for kernels, their self time)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    fused_undo.CONFIG["fused"] = False  # the verify step's writes by torch's ops (their launches are what it counts)
    LAYOUT["verify_chunk"] = False  # and its rows in turn
    vocab = model.cfg.vocab_size
    arms = {"plain": None, f"verify_k{k}": lambda done, n: [(t + 1) % vocab for t in reference[done:done + n]]}
    for name, drafts_of in arms.items():
        state = model.new_state(prefix.capacity)
        state.restore(prefix)
        cuda = model.device.type == "cuda"
        with torch_profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            if drafts_of is None:
                plain(model, state, first, steps, sp)
            else:
                verified(model, state, first, steps + 1, sp, drafts_of, k)  # steps + 1 tokens: `steps` verify steps
            sync(model)
        kind = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
        kernels = [e for e in prof.events() if e.device_type == kind]
        by_name: dict[str, list] = {}
        for e in kernels:
            by_name.setdefault(e.name[:90], []).append(e.device_time if cuda else e.self_cpu_time_total)
        top = sorted(by_name.items(), key=lambda kv: -len(kv[1]))[:25]
        emit("SPECULATIVE_KERNELS", where, arm=name, steps=steps, kernels_per_step=round(len(kernels) / steps, 1),
             device_us_per_step=round(sum(sum(ts) for ts in by_name.values()) / steps, 1),
             top=[[n, round(len(ts) / steps, 1), round(sum(ts) / steps, 1)] for n, ts in top])


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="mini")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--proxy-world", type=int, default=0, help="rank 0 of this many alone (benchmarks/rank_proxy.py)")
    p.add_argument("--k", type=int, action="append", default=[], help="drafts a verify step (repeatable)")
    p.add_argument("--prime", type=int, default=64)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--mtp", action="store_true", help="also arms drafted by the MTP layer (loaded for them)")
    p.add_argument("--zero-head", action="store_true",
                   help="the head's weight zeroed: every logit 0, so the MTP layer's drafts are always the model's "
                        "draws (its arms then show full acceptance, its cost included)")
    p.add_argument("--fused-undo", action="store_true",
                   help="every verify arm also with its writes by dsv4.kernels.undo (CONFIG fused; with "
                        "DSV4_UNDO_FUSED_CAPTURE=1 inside the graphs too): arms *_fu; the other arms take torch's ops")
    p.add_argument("--chunk", action="store_true",
                   help="every verify arm also with its rows as one chunk (layout CONFIG verify_chunk) and the fused "
                        "Undo: arms *_ch")
    p.add_argument("--graph", action="store_true",
                   help="CUDA: every arm also as graphs (the plain step's replay, the verify steps' VerifyReplay)")
    p.add_argument("--profile", type=int, default=0, metavar="K",
                   help="last (a profiler session slows later launches): eager verify steps of K drafts and plain "
                        "steps under torch.profiler, their kernels a step by name (SPECULATIVE_KERNELS)")
    a = p.parse_args()
    ks = a.k or [1, 3]
    t0 = time.perf_counter()
    model = load(a.preset, a.device, a.proxy_world, mtp=a.mtp)
    if a.zero_head:
        model.transformer.head_w.data.zero_()
    where = provenance(model.device, label(a.preset, a.proxy_world))
    emit("SPECULATIVE_BUILD", where, build_s=round(time.perf_counter() - t0, 1), ks=ks, zero_head=a.zero_head)
    sp = dsv4.SamplingParams(temperature=1.0, seed=20260907)
    prompt = torch.randint(2, model.cfg.vocab_size, (a.prime,), generator=torch.Generator().manual_seed(7)).tolist()
    cap = a.prime + a.steps + max(ks) + 16  # a verify step may run past `steps` by k tokens
    prefix = model.new_state(cap)
    model.prefill(prefix, prompt)
    first = model.draw(prefix, sp)
    state = model.new_state(cap)
    state.restore(prefix)
    reference, _ = plain(model, state, first, a.steps + max(ks), sp)  # also the first run: compiles; the drafts of
    # a step past `steps` too
    vocab = model.cfg.vocab_size
    graphs = a.graph and model.device.type == "cuda"
    arms = {"plain": None}
    for k in ks:
        arms[f"right_k{k}"] = (k, lambda done, n: reference[done:done + n], False)
        arms[f"wrong_k{k}"] = (k, lambda done, n: [(t + 1) % vocab for t in reference[done:done + n]], False)
        if a.mtp:
            arms[f"mtp_k{k}"] = (k, None, False)
    if graphs:
        arms.update({name + "_graph": (arm[0], arm[1], True) for name, arm in list(arms.items()) if arm is not None})
    plain_arms = [(name, arm) for name, arm in arms.items() if arm is not None]
    if a.fused_undo:
        arms.update({name + "_fu": (*arm, True) for name, arm in plain_arms})
    if a.chunk:
        arms.update({name + "_ch": (*arm, True, True) for name, arm in plain_arms})
    if graphs:
        arms["plain_graph"] = "graph"
        graph_state = model.new_state(cap)  # the plain step's full-token graph (its own state: one graph a state)
        graph_state.restore(prefix)
        model.enable_replay(graph_state, sp)
    # each verify arm its own state: a state's verify graphs are keyed by rows and drafts, not by the undo's form
    states = {name: model.new_state(cap) for name, arm in arms.items() if isinstance(arm, tuple)}

    def fused(arm) -> bool:
        return isinstance(arm, tuple) and len(arm) > 3

    def switch(arm):
        fused_undo.CONFIG["fused"] = fused(arm)
        LAYOUT["verify_chunk"] = isinstance(arm, tuple) and len(arm) > 4

    for name, arm in arms.items():  # a first row of each arm unscored: its compiles and captures
        switch(arm)
        if arm == "graph":
            graph_state.restore(prefix)
            plain(model, graph_state, first, min(a.steps, 8), sp)
        elif arm is not None:
            states[name].restore(prefix)
            verified(model, states[name], first, min(a.steps, 8), sp, arm[1], arm[0], arm[2])
    walls = {name: [] for name in arms}
    per_step = {name: [] for name in arms}
    same = {name: True for name in arms}
    for r in range(a.rounds):
        for name in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            arm = arms[name]
            switch(arm)
            if arm == "graph":
                graph_state.restore(prefix)
                out, wall = plain(model, graph_state, first, a.steps, sp)
                steps = a.steps
            elif arm is None:
                state.restore(prefix)
                out, wall = plain(model, state, first, a.steps, sp)
                steps = a.steps
            else:
                states[name].restore(prefix)
                out, wall, steps = verified(model, states[name], first, a.steps, sp, arm[1], arm[0], arm[2])
            walls[name].append(wall)
            per_step[name].append(wall / steps * 1e3)
            same[name] &= out == reference[:a.steps]
            emit("SPECULATIVE_ROW", round=r, arm=name, tok_s=round(a.steps / wall, 2), steps=steps,
                 ms_per_step=round(wall / steps * 1e3, 3))
    base = a.steps / statistics.median(walls["plain"])

    def kernel_nodes(name, arm):
        """The graph arm's kernel nodes a step: the full-token graph's, or the k-draft verify graph's."""
        if arm == "graph":
            return model.graph_census(graph_state).get("kernel_nodes")
        if isinstance(arm, tuple) and arm[2]:
            full = [g.census for key, g in model._verify_graphs.get(states[name], {}).items() if key[0] == arm[0] + 1]
            return full[0].get("kernel_nodes") if full else None
        return None

    for name, arm in arms.items():
        rate = a.steps / statistics.median(walls[name])
        emit("SPECULATIVE", where, arm=name, k=arm[0] if isinstance(arm, tuple) else None, tok_s=round(rate, 2),
             over_plain_eager=round(rate / base, 4), ms_per_step=round(statistics.median(per_step[name]), 3),
             same_stream_as_plain=same[name], kernel_nodes=kernel_nodes(name, arm), steps=a.steps,
             rounds=a.rounds, prime=a.prime)
    if a.profile:
        profile(model, prefix, first, sp, reference, a.profile, where)
    if not all(same.values()):
        sys.stderr.write("speculative_bench: a verify arm's stream is not the plain stream\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
