"""All-reduce latency behind the Comm door, eager and inside one CUDA graph, NCCL vs symmetric memory.

    python benchmarks/allreduce_bench.py [--layers 43] [--hidden 4096]

Spawns 2 ranks (one per GPU). Each rank captures 2 x layers `Comm.all_reduce` calls of a
[hidden] bf16 payload (the decode step's shape: the health flag rides as one extra element)
into one CUDA graph and replays it; latency per reduction = replay wall / (2 x layers), median
of several replays. The same door runs with reduce="nccl" and reduce="symm"
(torch.ops.symm_mem.one_shot_all_reduce over a symmetric-memory buffer). Prints one
ALLREDUCE record per (impl, mode) from rank 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dsv4.parallel import Comm
from dsv4.receipts import emit, provenance


def worker(rank: int, world: int, port: int, layers: int, hidden: int, reps: int):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    x = torch.randn(1, hidden, device="cuda", dtype=torch.bfloat16)
    n = 2 * layers
    for impl in ("nccl", "symm"):
        try:
            comm = Comm(layers, "cuda", rank=rank, world=world, group=dist.group.WORLD, reduce=impl)
        except Exception as e:  # noqa: BLE001 - report and go on with the other impl
            if rank == 0:
                emit("ALLREDUCE", impl=impl, error=str(e)[:300])
            continue

        def all_of_them():
            y = x
            for i in range(n):
                y = comm.all_reduce(y * 0.5, i // 2, ("attention", "moe")[i % 2])
            return y

        for _ in range(3):
            all_of_them()
        torch.cuda.synchronize()
        eager = []
        for _ in range(reps):
            dist.barrier()
            t = time.perf_counter()
            all_of_them()
            torch.cuda.synchronize()
            eager.append((time.perf_counter() - t) / n)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = all_of_them()
        graph.replay()
        torch.cuda.synchronize()
        replays = []
        for _ in range(reps):
            dist.barrier()
            torch.cuda.synchronize()
            t = time.perf_counter()
            graph.replay()
            torch.cuda.synchronize()
            replays.append((time.perf_counter() - t) / n)
        ok = bool(torch.isfinite(out).all())
        if rank == 0:
            for mode, vals in (("eager", eager), ("graph", replays)):
                emit("ALLREDUCE", provenance("cuda"), impl=impl, mode=mode, reductions=n,
                     payload=[hidden + 1, "bfloat16"], us_per_reduction_median=round(1e6 * statistics.median(vals), 2),
                     us_per_reduction_min=round(1e6 * min(vals), 2), reps=reps, finite=ok,
                     scope="door: census+arming+health flag+reduce, wall / reductions", ranks=world)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=43)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(2, port, args.layers, args.hidden, args.reps), nprocs=2, join=True)


if __name__ == "__main__":
    main()
