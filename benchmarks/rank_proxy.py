"""One rank of a TP/EP model on one GPU, its peers left out: the decode a rank of `flash` over 2 x H200 runs, measured
where only one GPU is lent.

    python benchmarks/rank_proxy.py --preset flash --world 2 [--rank 0] [--steps 64] [--rows 4] [--profile]
    python benchmarks/kernel_table.py --preset flash --proxy-world 2        # the same model, kernel by kernel
    python benchmarks/decode_ab_bench.py --preset flash --proxy-world 2 --arm ...

The model is rank `rank` of `world`: its own weights (random_weights(rank, world): its heads, its experts, its slice
of the vocabulary), so its own kernels, shapes and bytes. In place of the process group a LoopbackComm: an all-reduce
returns this rank's partial sum (the health flag inside it too, so the census, the verdict and refusals work as on one
rank), the head's all-gather tiles this rank's logits `world` times. Hence the tokens are not the N-rank model's (the
proxy's own streams still agree eager against graph), and what a rank waits for is missing: its collectives and its
slowest peer (the experts its peers' tokens picked). RANK_PROXY adds the collectives back as an estimate, from a
per-collective latency the caller states (--collective-us: FACTS.md's bare in-graph all-reduce on 2 x H200 by
default), labelled as an estimate.

Records (dsv4.receipts): RANK_PROXY_BUILD; RANK_PROXY_ROW per row (eager, graph, pipelined; ABBA between eager and
graph, a pipelined row after each graph row); RANK_PROXY (median tok/s per arm, same stream, the graph's census:
kernel nodes per token, reductions per token, and the estimate); with --profile dsv4.bench's BENCH_PROFILE (the
phases, bytes read per token, the roofline at the copy bandwidth measured in the same run).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from dsv4.bench import _profile, timed_pipelined
from dsv4.checkpoint.init import random_weights
from dsv4.checkpoint.memory import check_fits
from dsv4.config import preset as preset_config
from dsv4.engine import Model, _stand_in, placement
from dsv4.gate.timing import arms, timed_steps
from dsv4.generation import pipelined_tokens
from dsv4.model.forward import Transformer
from dsv4.parallel import Comm
from dsv4.receipts import emit, provenance
from dsv4.sampler import SamplingParams

PROMPT_SEED = 7
# FACTS.md: a bare all-reduce of one token's hidden state inside a CUDA graph on 2 x H200 (NCCL 7.6 us, symmetric
# memory 6.5 us); the door's bookkeeping is in the proxy's own kernels already.
COLLECTIVE_US = 7.6


class LoopbackComm(Comm):
    """Rank `rank` of `world` with no peers: every collective stays on this rank (see the module's docstring)."""

    def __init__(self, n_layers: int, device, rank: int, world: int):
        if not 0 <= rank < world:
            raise ValueError(f"rank={rank} is not in [0, world={world})")
        super().__init__(n_layers, device)  # world 1 to the constructor: no process group to ask for a backend
        self.rank, self.world = rank, world

    def _send(self, payload, buf, symm):
        return payload

    def _reduce(self, payload):
        return payload

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return x.repeat(self.world, *([1] * (x.dim() - 1)))


def build_proxy(name: str, world: int, rank: int = 0, device=None, dtype=None, seed: int = 0,
                mtp: bool = False) -> Model:
    """Rank `rank` of preset `name` split over `world` ranks, alone on `device`, with a LoopbackComm (with `mtp`,
    its MTP layer too)."""
    device, dtype = placement(device, dtype)
    cfg = preset_config(name)
    check_fits(cfg, rank, world, device, dtype, f"preset {name!r}, rank {rank} of {world} (proxy)", mtp)
    weights = random_weights(cfg, rank=rank, world=world, device=device, dtype=dtype, seed=seed, mtp=mtp)
    comm = LoopbackComm(cfg.num_hidden_layers + (cfg.num_nextn_predict_layers if mtp else 0), device, rank, world)
    return Model(cfg, Transformer(cfg, weights, comm, device, dtype), _stand_in(cfg))


def load(preset: str, device, proxy_world: int = 0, seed: int = 0, mtp: bool = False):
    """What the benchmark scripts measure: the preset's model, or with proxy_world > 0 rank 0 of that many (proxy)."""
    if proxy_world:
        return build_proxy(preset, proxy_world, 0, device, seed=seed, mtp=mtp)
    import dsv4

    return dsv4.load(preset, device=device, seed=seed, mtp=mtp)


def label(preset: str, proxy_world: int) -> str:
    return f"{preset} (rank 0 of {proxy_world}, proxy)" if proxy_world else preset


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="flash")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--prime", type=int, default=64)
    ap.add_argument("--steps", type=int, default=64, help="steps per graph and pipelined row")
    ap.add_argument("--eager-steps", type=int, default=8, help="steps per eager row")
    ap.add_argument("--rows", type=int, default=4, help="rows per arm")
    ap.add_argument("--profile", action="store_true", help="also BENCH_PROFILE (phases, bytes, roofline)")
    ap.add_argument("--collective-us", type=float, default=COLLECTIVE_US,
                    help="the latency of one collective, for RANK_PROXY's estimate")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    model = build_proxy(args.preset, args.world, args.rank, args.device)
    where = provenance(model.device, f"{args.preset} (rank {args.rank} of {args.world}, proxy)")
    emit("RANK_PROXY_BUILD", where, build_s=round(time.perf_counter() - t0, 2), world=args.world, rank=args.rank,
         layers=model.cfg.num_hidden_layers, heads=model.transformer.heads,
         experts=[model.transformer.experts.start, model.transformer.experts.stop],
         gib=round(model.memory_allocated() / 2**30, 2), dtype=str(model.dtype).removeprefix("torch."))
    cuda = model.device.type == "cuda"
    sp = SamplingParams(temperature=1.0, seed=20260907)
    prompt = torch.randint(2, model.cfg.vocab_size, (args.prime,),
                           generator=torch.Generator().manual_seed(PROMPT_SEED)).tolist()
    cap = args.prime + max(args.steps, args.eager_steps) + 8
    prefix = model.new_state(cap)
    model.prefill(prefix, prompt)
    first = model.draw(prefix, sp)
    states = {arm: model.new_state(cap) for arm in ("eager", "graph", "pipelined")}
    if cuda:  # the captures, outside the timed rows
        states["graph"].restore(prefix)
        model.enable_replay(states["graph"], sp)
        model.step(states["graph"], first, sp)
        states["pipelined"].restore(prefix)
        list(pipelined_tokens(model, states["pipelined"], first, 2, sp, keep_graph=True))
    census0 = model.census().clone()
    order = arms(args.rows * 2, 1) if cuda else ["eager"] * args.rows
    order = [a for arm in order for a in ((arm, "pipelined") if arm == "graph" else (arm,))]
    rates: dict[str, list[float]] = {}
    streams: dict[str, set] = {}
    for row, arm in enumerate(order):
        steps = args.eager_steps if arm == "eager" else args.steps
        state = states[arm]
        state.restore(prefix)
        if arm == "pipelined":
            drawn, ns = timed_pipelined(model, state, first, steps, sp)
        else:
            tokens, last, ns = timed_steps(model, state, first, steps, sp)
            drawn = tokens[1:] + [last]
        rates.setdefault(arm, []).append(steps / (ns / 1e9))
        streams.setdefault(arm, set()).add(tuple(drawn[:args.eager_steps]))
        emit("RANK_PROXY_ROW", row=row, arm=arm, steps=steps, tok_s=round(rates[arm][-1], 3))
    tokens_run = sum(args.eager_steps if a == "eager" else args.steps for a in order)
    reductions = float((model.census() - census0).sum()) / tokens_run
    median = {arm: statistics.median(r) for arm, r in rates.items()}
    same = len(set().union(*streams.values())) == 1
    census = model.graph_census(states["graph"]) if cuda else {}
    record = dict(world=args.world, rank=args.rank, steps_per_row=args.steps, eager_steps_per_row=args.eager_steps,
                  rows_per_arm=args.rows, **{f"{arm}_tok_s": round(v, 3) for arm, v in median.items()},
                  same_stream=same, reductions_per_token=reductions, graph_census=census)
    if cuda:
        collectives = reductions + 1  # and the head's all-gather
        for arm in ("graph", "pipelined"):
            us = 1e6 / median[arm] + collectives * args.collective_us
            record[f"{arm}_tok_s_with_collectives_estimate"] = round(1e6 / us, 1)
        record.update(collective_us=args.collective_us, collectives_per_token=collectives,
                      estimate="1e6 / (the arm's us per token + collectives x collective_us); the wait for the "
                               "slowest rank is not in it")
    emit("RANK_PROXY", where, **record,
         scope="one rank's model.step alone on one device (LoopbackComm: no collective runs); median row")
    if args.profile:
        _profile(model, prefix, first, sp, median["graph" if cuda else "eager"], where["preset"], args.steps)
    if not same:
        sys.stderr.write("rank_proxy: rows sampled different streams\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
