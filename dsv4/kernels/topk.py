"""The lightning indexer's selection in one launch (reference: torch.topk in dsv4.kernels.compressor.topk).

The sort keys of dsv4.kernels.compressor.index_keys are distinct int64s whose low 32 bits are their own column,
so the k smallest keys in ascending order say everything: their low bits are torch.topk's indices (no positions
to carry along), and key < VISIBLE_BELOW is the valid flag. One program per row holds the whole row in
registers and runs Triton's bitonic top-k (tl.topk) on the keys' bitwise complements (~ reverses int64 order,
tl.topk keeps the largest): with k = log2(K_PAD) (k padded to a power of two; the row to N_PAD), it costs
k(k+1)/2 compare-exchange passes over the N_PAD keys (sorting runs of K_PAD), then rounds that halve the row
(a min pass) and merge what is left (k passes): together under k + 2 passes over N_PAD. Flash (K 512): under
56 passes, all in registers; one read of the row, one write of k indices and flags. A pass whose partners sit in
other warps goes through shared memory (N_PAD keys: 64 KB at 8192).
Above MAX_N keys (a row too long for one program's registers) the caller keeps torch.topk, a choice made on
shapes alone.

Padding keys (columns N..N_PAD) are INT64_MAX: no key of index_keys reaches it (its low 32 bits would be
column 2**32 - 1), so with k <= N none is selected.
"""

import os

import torch

from . import launcher, next_pow2, pdl_wait

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # session 8, call 1 (benchmarks/RESULTS.md): the CUDA tests, and equal bits in topk_bench

# Keys per row one program holds (DSV4_TOPK_MAX_N lowers it; 0: torch.topk always). ptxas for sm_90 at K 512,
# 16 keys a thread: no spills up to 8192 (102 registers, 16 warps); at 16384 ~0.5 KB of spills. Measured on an
# H200 (topk_bench, 16 rows, K 512; session 8 call 1): the kernel 3.6 us against torch.topk's 46 at 512 keys,
# 23 against 43 at 2,048, but 101 against 69 at 8,192 and 239 against 106 at 16,384 (one program a row runs out
# of parallelism): so one launch up to 4,096 keys (a decode step's first ~16K tokens of context), torch beyond.
MAX_N = min(16384, int(os.environ.get("DSV4_TOPK_MAX_N", "4096")))
# keys_per_thread: the warps follow N_PAD (4 at least, 32 at most); benchmarks/topk_bench.py sweeps it (8 was
# the fastest at 512 and 2,048 keys).
CONFIG = {"keys_per_thread": 8}


def _topk_kernel(keys_ptr, sel_ptr, valid_ptr, N, K, VISIBLE_BELOW: constexpr, K_PAD: constexpr,
                 N_PAD: constexpr):
    pdl_wait()
    t = tl.program_id(0).to(tl.int64)
    n = tl.arange(0, N_PAD)
    keys = tl.load(keys_ptr + t * N + n, mask=n < N, other=0)
    flipped = tl.where(n < N, ~keys, -0x7FFFFFFFFFFFFFFF - 1)  # padding: ~INT64_MAX, never among the largest
    top = ~tl.topk(flipped, K_PAD)  # the K_PAD smallest keys, ascending
    r = tl.arange(0, K_PAD)
    tl.store(sel_ptr + t * K + r, top & 0xFFFFFFFF, mask=r < K)
    tl.store(valid_ptr + t * K + r, top < VISIBLE_BELOW, mask=r < K)


def supported(keys: torch.Tensor, k: int) -> bool:
    return keys.dim() == 2 and keys.dtype == torch.int64 and keys.is_contiguous() and 1 <= k <= keys.shape[-1] <= MAX_N


def smallest(keys: torch.Tensor, k: int, visible_below: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices [T, k] of each row's k smallest keys, ascending; valid [T, k]: key < visible_below). The keys
    are distinct, each one's low 32 bits its column (dsv4.kernels.compressor.index_keys)."""
    T, N = keys.shape
    sel = torch.empty(T, k, dtype=torch.int64, device=keys.device)
    valid = torch.empty(T, k, dtype=torch.bool, device=keys.device)
    n_pad = next_pow2(N)
    warps = min(32, max(4, n_pad // (32 * CONFIG["keys_per_thread"])))
    launcher(_topk_kernel, keys)[(T,)](keys, sel, valid, N, k, VISIBLE_BELOW=visible_below, K_PAD=next_pow2(k),
                                       N_PAD=n_pad, num_warps=warps)
    return sel, valid
