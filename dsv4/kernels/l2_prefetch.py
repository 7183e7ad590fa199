"""The next weights pulled into L2 while latency-bound kernels run (a decode step's weight prefetch).

A decode step alternates weight-streaming kernels (the GEMVs, the experts) with kernels that read almost nothing
from DRAM and are bound by their own latency: the mHC boundaries, the norms, the router, the compressors' pools,
the indexer's top-k, the attention core (mini at one token: ~300 of its ~1,170 us). While those run, DRAM idles,
and each GEMV after them starts its weight's stream cold. Here, at a few points of the forward (ahead), a small
kernel on a side stream asks the L2 for the weights the next GEMVs will read (cp.async.bulk.prefetch.L2: a hint,
no registers, no result), so that their bytes arrive while the latency-bound kernels run and the GEMV finds them in
L2. Ascend's vLLM does the same on its own hardware ("weight prefetch": a pipeline of its own beside the vector
ops).

A prefetch changes no value anywhere: it writes nothing and the kernels read the same bytes from the same
addresses, so every bit of a step is the same with it on or off (tests/test_l2_prefetch.py holds logits and
tokens equal, eager and replayed). The side stream forks from the step's stream after the kernel just launched
and joins it at the end of the forward (join), so a captured step's graph has it as a branch.

CONFIG budget_mb (DSV4_L2_PREFETCH, MB a fork point; 0 = off, the default until a GPU run shows the gain): how
much of each point's weights (in the order they are read) is asked for. The L2 of an H100/H200 is 50 MB: a point
asks for less than that, or its own last bytes evict its first. piece: the bytes of one prefetch instruction; lanes:
instructions a program (one warp).
"""

from __future__ import annotations

import torch

from ..formats import QWeight
from . import cdiv, getenv, interpreting, launcher, pdl_wait

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # no triton: nothing is prefetched
    tl, constexpr = None, int

GPU_CHECKED = False  # not yet run on a GPU: off by default (budget_mb 0) until then

CONFIG = {"budget_mb": float(getenv("DSV4_L2_PREFETCH", "0")), "piece": int(getenv("DSV4_L2_PREFETCH_PIECE", "8192")),
          "lanes": 32, "sites": frozenset(getenv("DSV4_L2_PREFETCH_SITES", "attention,queries,output,moe").split(","))}
SITES = ("attention", "queries", "output", "moe")  # the forward's fork points (ahead's site)
REGIONS = 4  # weights (or parts of one) a launch takes

_ASM = """{
 .reg .pred %pf;
 setp.gt.s32 %pf, $2, 0;
 @%pf cp.async.bulk.prefetch.L2.global [$1], $2;
 mov.u32 $0, 0;
}"""
if tl is not None:  # a kernel reads module globals only as constexprs
    _ASM = tl.constexpr(_ASM)


def _prefetch_kernel(p0, p1, p2, p3, n0, n1, n2, n3, PIECE: constexpr, LANES: constexpr):
    """Grid (pieces / LANES,): lane i of program p asks for bytes [o, o + PIECE) of the regions laid end to end
    (o = (p LANES + i) PIECE; a region's last piece shorter, none past the end). p0..p3 byte pointers, n0..n3 their
    lengths (multiples of 16, as the instruction's size and address must be)."""
    pdl_wait()
    o = (tl.program_id(0).to(tl.int64) * LANES + tl.arange(0, LANES)) * PIECE
    e0 = n0.to(tl.int64)
    e1 = e0 + n1
    e2 = e1 + n2
    e3 = e2 + n3
    address = tl.where(o < e0, p0 + o, tl.where(o < e1, p1 + (o - e0), tl.where(o < e2, p2 + (o - e1),
                                                                                   p3 + (o - e2))))
    end = tl.where(o < e0, e0, tl.where(o < e1, e1, tl.where(o < e2, e2, e3)))
    size = tl.minimum(end - o, PIECE).to(tl.int32)
    tl.inline_asm_elementwise(_ASM, "=r,l,r", [address.to(tl.int64), size], dtype=tl.int32, is_pure=False, pack=1)


def on() -> bool:
    return CONFIG["budget_mb"] > 0


def plan(parts: list, budget: int) -> list[torch.Tensor]:
    """The byte views to ask for: the tensors of `parts` (tensors, or QWeights: their data; a block scale is 1/16,384
    of its FP8 weight, left to the GEMV) in order, the last one cut where the budget (bytes) runs out; each view
    16-byte aligned at both ends (a part not aligned at its start, or not contiguous, is skipped: the instruction
    takes one aligned byte range)."""
    views, left = [], budget
    for part in parts:
        t = part.data if isinstance(part, QWeight) else part
        if left < 16 or t.data_ptr() % 16 or not t.is_contiguous():
            continue
        n = min(t.numel() * t.element_size(), left) // 16 * 16
        if n:
            views.append(t.reshape(-1).view(torch.uint8)[:n])
            left -= n
    return views


_side: dict = {}  # device index -> its side stream
_forked: set = set()  # devices whose side stream has work the step's stream has not joined yet


def ahead(parts: list, device: torch.device, site: str) -> None:
    """Ask the L2 for the first budget_mb MB of `parts` (the weights the next GEMVs read, in order), on the side
    stream, after everything the step's stream has so far. Nothing where it is off, the fork point `site` (one of
    SITES: before the boundary into attention, after its q_a/kv GEMV, after its queries, before the boundary into
    the MoE) is not in CONFIG sites, or the weights are not CUDA."""
    if site not in SITES:
        raise ValueError(f"l2_prefetch: site {site!r}: allowed {list(SITES)}")
    if not on() or site not in CONFIG["sites"] or device.type != "cuda" or tl is None or interpreting():
        return
    index = torch.cuda.current_device() if device.index is None else device.index
    views = plan(parts, int(CONFIG["budget_mb"] * 2**20))
    if not views:
        return
    step_stream = torch.cuda.current_stream(device)
    side = _side.get(index)
    if side is None:
        side = _side[index] = torch.cuda.Stream(device)
    side.wait_stream(step_stream)
    _forked.add(index)
    with torch.cuda.stream(side):
        launch(views)


def launch(views: list[torch.Tensor]) -> None:
    """The prefetch kernel over byte views (plan's), REGIONS a launch, on the current stream."""
    piece, lanes = CONFIG["piece"], CONFIG["lanes"]
    for i in range(0, len(views), REGIONS):
        group = views[i:i + REGIONS]
        group = group + [group[0][:0]] * (REGIONS - len(group))
        total = sum(v.numel() for v in group)
        launcher(_prefetch_kernel, group[0])[(cdiv(cdiv(total, piece), lanes),)](
            *group, *(v.numel() for v in group), PIECE=piece, LANES=lanes, num_warps=1)


def join(device: torch.device) -> None:
    """The step's stream waits for the side stream's prefetches (a captured graph's branch must rejoin it)."""
    if device.type != "cuda" or not _forked:
        return
    index = torch.cuda.current_device() if device.index is None else device.index
    if index in _forked:
        torch.cuda.current_stream(device).wait_stream(_side[index])
        _forked.discard(index)
