"""Two lanes of one step: a chain of launches that does not depend on the step's other launches runs beside them.

A compressed layer's compressor and indexer (pooling, norm + RoPE, the index queries, keys and top-k) read only x,
q_res and their caches, while the queries' path (wq_b, the norm + RoPE of q and of kv) reads q_res and kv_a: each is a
chain of small latency-bound launches using few SMs, and the attention needs both. `Fork` puts the first on a side
stream (the side lane), after everything the step's stream has enqueued so far; `join` makes the step's stream wait
for it. The GPU then runs the two chains at once; eager steps and graph captures (a captured fork and join) enqueue
the same launches, so the bits are the same as on one stream (no launch of one lane reads what the other writes
before the join; scratch kept across launches is per lane: kernels.LANE).

The switch: CONFIG["overlap"] (DSV4_OVERLAP=1, read at import; off by default until its GPU run). CPU tensors and
the switch off: a Fork changes nothing (one stream).

Memory: a tensor made on the side lane and used on the step's stream after the join goes back to the side stream's
free blocks when freed; the side stream takes new work only after a fork, which orders it after every use the
step's stream had enqueued, so a block is never reused under a pending read.
"""

from __future__ import annotations

import os

import torch

from .. import kernels

CONFIG = {"overlap": os.environ.get("DSV4_OVERLAP", "0") == "1"}
_streams: dict[torch.device, torch.cuda.Stream] = {}


class Fork:
    """`with fork:` enqueues its block on the side lane (after what the step's stream has enqueued before the
    Fork was made); `fork.join()` makes the step's stream wait for that block."""

    def __init__(self, like: torch.Tensor):
        self.on = CONFIG["overlap"] and like.is_cuda
        if not self.on:
            return
        device = like.device
        self.main = torch.cuda.current_stream(device)
        self.side = _streams.get(device)
        if self.side is None:
            self.side = _streams[device] = torch.cuda.Stream(device)
        self.side.wait_stream(self.main)

    def __enter__(self):
        if self.on:
            self._ctx = torch.cuda.stream(self.side)
            self._ctx.__enter__()
            kernels.LANE[0] = 1
        return self

    def __exit__(self, *exc):
        if self.on:
            kernels.LANE[0] = 0
            self._ctx.__exit__(*exc)

    def join(self):
        if self.on:
            self.main.wait_stream(self.side)
