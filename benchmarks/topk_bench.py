"""The lightning indexer's selection at Flash's k (index_topk 512): torch.topk and its valid compare (the
reference in dsv4.kernels.compressor.topk) against the one-launch kernel (dsv4.kernels.topk), per call.

Keys as index_keys writes them, from scores like the indexer's: relu of a normal draw (half exact zeros: ties
that the column breaks) over the first three quarters of the row, -inf (invisible: the store's uncommitted
tail) over the rest. Rows: 1 (a solo decode token) and 16 (a pooled step's rows); N keys a row in {512, 2048,
8192, 16384, 65536} (65536 is above MAX_N: the wrapper keeps torch.topk, said as "kernel": false). Kernel arms
sweep CONFIG keys_per_thread (the warps per program). Figures: median microseconds per call, `graph_us` over 50
calls replayed in one CUDA graph (as decode runs), `eager_us` single calls. Each kernel record says whether its
indices and flags equal the reference's bit for bit (`equal`).

    python benchmarks/topk_bench.py      # one GPU: TOPK records, one JSON line each, then TOPK_BEST per shape
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compressor_bench import eager_us, graph_us  # noqa: E402

from dsv4.config import preset  # noqa: E402
from dsv4.kernels import compressor  # noqa: E402
from dsv4.kernels import topk as topk_kernel  # noqa: E402
from dsv4.receipts import emit  # noqa: E402

SIZES = (512, 2048, 8192, 16384, 65536)
ROWS = (1, 16)
KEYS_PER_THREAD = (8, 16, 32)


def indexer_keys(T: int, N: int, device, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scores = torch.relu(torch.randn(T, N, generator=g))
    scores[:, (3 * N) // 4:] = float("-inf")
    bits = scores.view(torch.int32)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (((~ordered).to(torch.int64) << 32) | torch.arange(N)).to(device)


def reference(keys: torch.Tensor, k: int):
    top = torch.topk(keys, k, dim=-1, largest=False, sorted=True)
    return top.indices, top.values < compressor._VISIBLE_BELOW


def main():
    k = preset("flash").index_topk
    default = dict(topk_kernel.CONFIG)
    for T in ROWS:
        for N in SIZES:
            keys = indexer_keys(T, N, "cuda", seed=N + T)
            kk = min(k, N)
            ref = reference(keys, kk)
            shape = {"rows": T, "n": N, "k": kk}
            base = graph_us(lambda: reference(keys, kk))
            emit("TOPK", **shape, arm="torch", graph_us=round(base, 2),
                 eager_us=round(eager_us(lambda: reference(keys, kk)), 2))
            if not topk_kernel.supported(keys, kk):
                emit("TOPK", **shape, arm="kernel", kernel=False, note=f"above MAX_N {topk_kernel.MAX_N}: torch.topk")
                continue
            best = None
            for per_thread in KEYS_PER_THREAD:
                topk_kernel.CONFIG.update(keys_per_thread=per_thread)
                fn = lambda: topk_kernel.smallest(keys, kk, compressor._VISIBLE_BELOW)  # noqa: E731
                sel, valid = fn()
                equal = torch.equal(sel, ref[0]) and torch.equal(valid, ref[1])
                us = graph_us(fn)
                emit("TOPK", **shape, arm="kernel", kernel=True, keys_per_thread=per_thread, equal=equal,
                     graph_us=round(us, 2), eager_us=round(eager_us(fn), 2), torch_over_kernel=round(base / us, 2))
                if equal and (best is None or us < best[1]):
                    best = (per_thread, us)
                topk_kernel.CONFIG.update(default)
            emit("TOPK_BEST", **shape, torch_us=round(base, 2),
                 kernel_us=None if best is None else round(best[1], 2),
                 keys_per_thread=None if best is None else best[0], default_keys_per_thread=default["keys_per_thread"])


if __name__ == "__main__":
    main()
