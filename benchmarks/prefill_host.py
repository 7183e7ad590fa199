"""Where a prefill's host time goes (is it launch-bound or sync-bound?), on rank 0.

    python benchmarks/prefill_host.py --preset flash --ranks 2 --tokens 4096 [--chunk N]

One warm-up prefill, then: (1) the wall of a prefill and the host time until model.prefill returns without a
final device sync (the enqueue time: when it is close to the wall, the host is the bound); (2) the same
prefill under torch.cuda's sync debug mode, every synchronizing call site counted (file:line, message); (3)
one prefill under torch.profiler (CPU + CUDA): the top host ops by self CPU time, and the CUDA runtime calls
(cudaLaunchKernel, cudaStreamSynchronize, cudaMemcpyAsync) with their counts and host time ("Command Buffer
Full": the host waited for the GPU), and every kernel by device time. Records (dsv4.receipts): PREFILL_HOST,
PREFILL_SYNC, PREFILL_HOST_OP, PREFILL_DEVICE_TOTAL, PREFILL_DEVICE_OP.
"""

from __future__ import annotations

import argparse
import collections
import time
import traceback
import warnings

import torch

import dsv4
from dsv4.receipts import emit, provenance


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="flash")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--chunk", type=int, default=None)
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    model = dsv4.load(args.preset, device=args.device, ranks=args.ranks, seed=0)
    try:
        V = model.cfg.vocab_size
        ids = [(i * 7919 + 13) % V for i in range(args.tokens)]
        prefix = model.new_state(args.tokens + 64)
        state = model.new_state(args.tokens + 64)
        sync = model.synchronize

        def run():
            state.restore(prefix)
            sync()
            t0 = time.perf_counter()
            model.prefill(state, ids, args.chunk)
            t1 = time.perf_counter()
            sync()
            return t1 - t0, time.perf_counter() - t0

        run()  # warm-up: compiles, allocator
        walls = [run() for _ in range(3)]
        enqueue, wall = sorted(walls, key=lambda w: w[1])[1]
        emit("PREFILL_HOST", provenance(model.device, args.preset), tokens=args.tokens, chunk=args.chunk,
             wall_s=round(wall, 4), enqueue_s=round(enqueue, 4), tok_s=round(args.tokens / wall, 1),
             walls=[[round(a, 4), round(b, 4)] for a, b in walls])
        sites = collections.Counter()
        cuda = model.device.type == "cuda"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if cuda:
                torch.cuda.set_sync_debug_mode(1)
            try:
                state.restore(prefix)
                model.prefill(state, ids, args.chunk)
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode(0)
        for w in caught:
            sites[(f"{w.filename}:{w.lineno}", str(w.message)[:80])] += 1
        for (where, msg), n in sites.most_common(30):
            emit("PREFILL_SYNC", where=where, message=msg, calls=n)
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        state.restore(prefix)
        sync()
        with torch.profiler.profile(activities=acts) as prof:
            model.prefill(state, ids, args.chunk)
            sync()
        rows = prof.key_averages()
        for e in sorted(rows, key=lambda e: e.self_cpu_time_total, reverse=True)[:args.top]:
            emit("PREFILL_HOST_OP", name=e.key[:90], calls=e.count, self_cpu_ms=round(e.self_cpu_time_total / 1e3, 2),
                 cpu_total_ms=round(e.cpu_time_total / 1e3, 2))
        if cuda:  # every kernel by name, Triton's included (no range attribution): where the GPU's time goes
            dev = [e for e in rows if e.self_device_time_total > 0]
            total = sum(e.self_device_time_total for e in dev)
            emit("PREFILL_DEVICE_TOTAL", device_ms=round(total / 1e3, 2), kernels=sum(e.count for e in dev))
            for e in sorted(dev, key=lambda e: e.self_device_time_total, reverse=True)[:args.top]:
                emit("PREFILL_DEVICE_OP", name=e.key[:100], calls=e.count,
                     device_ms=round(e.self_device_time_total / 1e3, 2))
    except Exception:
        traceback.print_exc()
        raise
    finally:
        model.close() if hasattr(model, "close") else None


if __name__ == "__main__":
    main()
