"""The host's cost of launching a captured graph (torch.cuda.CUDAGraph.replay: cudaGraphLaunch), by node count, PDL
and streams, and mini's full-token graph beside them.

Session 40 call 1 (benchmarks/step_host_gap.py): the graph arm's replay() of mini's step took 160-166 us of host time
a token (the GPU idle before it), the kernel table's 161 us between the input's copy and the graph's first kernel.
The pipelined arm hides it behind the previous token's graph; the graph arm (Model.step) and a server's batched step,
which read each token back before the next launch, pay it every token. This bench asks what it scales with:

  synthetic: `nodes` launches of one trivial Triton kernel (pdl_wait first, under the process's DSV4_PDL, through
             dsv4.kernels.launcher like every kernel of a step), on one stream or alternating between the stream and a
             lane (forked and joined around each pair), captured in one graph;
  mini:      the full-token graph of a mini state (Model.enable_replay), replayed with its input unchanged;
  *_after_profiler: the same after a torch.profiler session in the process (the replay's census profiled a
             state's first replay until session 40).

Each is replayed with the GPU idle before it (synchronize, then replay(), timed by perf_counter: `idle_host_us`) and
back to back (`queued_host_us`, the host time of a replay while earlier ones run). Run it once per DSV4_PDL value (PDL
is read at import). Prints GRAPH_LAUNCH {"what", "nodes", "pdl", "idle_host_us", "queued_host_us", "gpu_us"}.

    python benchmarks/graph_launch_bench.py [--mini]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import dsv4
from dsv4 import kernels
from dsv4.kernels import lanes, pdl_wait
from dsv4.receipts import emit, provenance

try:
    import triton.language as tl
except ImportError:  # pragma: no cover - a GPU bench
    tl = None


def _tick_kernel(x_ptr):
    pdl_wait()
    v = tl.load(x_ptr)
    tl.store(x_ptr, v + 1)


def synthetic_graph(nodes: int, two_streams: bool) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    x = torch.zeros(1, dtype=torch.int32, device="cuda")
    k = kernels.launcher(_tick_kernel, x)
    device = x.device

    def body():
        for i in range(nodes):
            if two_streams and i % 2:
                with lanes.beside(device):
                    k[(1,)](x)
                lanes.join(device)
            else:
                k[(1,)](x)

    body()  # compile, outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    return g, x


def timings(replay, reps: int = 64) -> dict:
    idle, queued, gpu = [], [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        t0 = time.perf_counter()
        replay()
        t1 = time.perf_counter()
        b.record()
        b.synchronize()
        idle.append((t1 - t0) * 1e6)
        gpu.append(a.elapsed_time(b) * 1e3)
    torch.cuda.synchronize()
    for _ in range(reps):
        t0 = time.perf_counter()
        replay()
        queued.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return {"idle_host_us": round(statistics.median(idle), 2), "queued_host_us": round(statistics.median(queued), 2),
            "gpu_us": round(statistics.median(gpu), 2)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="1,32,128,512")
    ap.add_argument("--mini", action="store_true", help="also mini's full-token graph")
    a = ap.parse_args()
    sizes = [int(v) for v in a.nodes.split(",")]
    where = provenance(torch.device("cuda"), "synthetic")
    for two in (False, True):
        for n in sizes:
            g, _ = synthetic_graph(n, two)
            emit("GRAPH_LAUNCH", where, what="tick_two_streams" if two else "tick", nodes=n, pdl=kernels.PDL,
                 **timings(g.replay))
    graph = None
    if a.mini:  # its census read from the graph (dsv4.graph_nodes): no profiler session in the process yet
        model = dsv4.load("mini", device="cuda", seed=0)
        sp = dsv4.SamplingParams(temperature=1.0, seed=20260907)
        state = model.new_state(256)
        model.prefill(state, list(range(2, 66)))
        model.enable_replay(state, sp)
        model.step(state, 7, sp)  # the capture
        graph, census = state.replay.graph, state.replay.census
        mini = provenance(model.device, "mini")
        # replays of the same input, each a committed step: the state has room for all of them (96 + 65 < 256)
        emit("GRAPH_LAUNCH", mini, what="mini_full_token", nodes=census.get("kernel_nodes"), pdl=kernels.PDL,
             census=census, **timings(graph.replay, reps=24))
    # the same graphs after one torch.profiler session in the process (what the replay census did until session 40:
    # it profiled a state's first replay)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
        g, _ = synthetic_graph(8, False)
        g.replay()
        torch.cuda.synchronize()
    for n in sizes:
        g, _ = synthetic_graph(n, False)
        emit("GRAPH_LAUNCH", where, what="tick_after_profiler", nodes=n, pdl=kernels.PDL, **timings(g.replay))
    if graph is not None:
        emit("GRAPH_LAUNCH", mini, what="mini_full_token_after_profiler", nodes=census.get("kernel_nodes"),
             pdl=kernels.PDL, **timings(graph.replay, reps=24))


if __name__ == "__main__":
    main()
