"""Weights pulled into L2 ahead of their GEMV, on a side stream, while latency-bound kernels run
(CONFIG["on"], DSV4_L2_PREFETCH=1; off until a GPU run).

A decode layer alternates weight-streaming GEMVs with stretches of small latency-bound kernels that leave
DRAM idle: after the query projection (wq_b) come the query/key norms and rope and attention's two kernels
(~15 us on an H200), and only then the output projection wo_a (33.5 MB at Flash's widths on one rank). `l2`
asks L2 for a weight's bytes from a side stream that starts once the work queued so far has completed: the
prefetch runs during that stretch, and the GEMV after it finds its weight in L2 (50 MB on an H100/H200)
instead of DRAM. The forward calls `l2` right after the kernels the stretch follows, and `join` at its end
(the side stream's work joins the step's stream again: a captured graph's branch ends inside the graph).

A prefetch changes no value: the GEMV reads the same bytes from wherever they are, so the step's bits are the
same with and without it (eager and graph alike run it). Each program asks for LINES 128-byte lines a lane
(prefetch.global.L2), a tensor's last line repeated past its end.
"""

from __future__ import annotations

import torch

from . import cdiv, getenv, interpreting, launcher, pdl_wait

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = False  # not through the GPU checks yet: runs only where CONFIG["on"] asks for it
CONFIG = {"on": getenv("DSV4_L2_PREFETCH", "0") == "1", "lines": 8, "num_warps": 4}
LINE = 128  # bytes of an L2 line
_LINE = constexpr(LINE)


def _prefetch_kernel(ptr, n_lines, LINES: constexpr, LANES: constexpr):
    """Program p asks L2 for lines [p * LINES * LANES, (p + 1) * LINES * LANES) of the bytes at ptr."""
    pdl_wait()
    first = tl.program_id(0).to(tl.int64) * (LINES * LANES)
    lane = tl.arange(0, LANES)
    for i in tl.static_range(LINES):
        line = tl.minimum(first + i * LANES + lane, n_lines - 1)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\nmov.u32 $0, 0;", "=r,l", [ptr + line * _LINE],
                                  dtype=tl.int32, is_pure=False, pack=1)


_side: dict[int, torch.cuda.Stream] = {}
_forked: set[int] = set()  # devices whose side stream has work the step's stream has not joined yet


def _regions(weights) -> list[torch.Tensor]:
    """The tensors that hold weights' bytes (a QWeight's data and scales), each contiguous."""
    out = []
    for w in weights:
        for t in ((w.data, w.scale) if hasattr(w, "fmt") else (w,)):
            if t is not None and t.is_contiguous() and t.numel():
                out.append(t)
    return out


def l2(*weights) -> None:
    """Ask L2 for these weights' bytes (tensors or QWeights) on the device's side stream, once the work queued on the
    current stream so far has completed. Nothing where CONFIG["on"] is off, on CPU and under the interpreter."""
    regions = _regions([w for w in weights if w is not None])
    if not CONFIG["on"] or not regions or not regions[0].is_cuda or interpreting():
        return
    device = regions[0].device
    side = _side.get(device.index)
    if side is None:
        side = _side[device.index] = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    lanes = 32 * CONFIG["num_warps"]
    with torch.cuda.stream(side):
        for t in regions:
            n_lines = cdiv(t.numel() * t.element_size(), LINE)
            launcher(_prefetch_kernel, t)[(cdiv(n_lines, CONFIG["lines"] * lanes),)](
                t.view(torch.uint8) if t.dim() else t.view(1).view(torch.uint8), n_lines, LINES=CONFIG["lines"],
                LANES=lanes, num_warps=CONFIG["num_warps"])
    _forked.add(device.index)


def join(device: torch.device) -> None:
    """The current stream waits for the side stream's prefetches (the end of a captured step's branch)."""
    if device.type == "cuda" and device.index in _forked:
        torch.cuda.current_stream(device).wait_stream(_side[device.index])
        _forked.discard(device.index)
