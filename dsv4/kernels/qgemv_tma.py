"""The decode GEMV of a stored FP8 weight with its tiles brought in by the Tensor Memory Accelerator (Gluon, sm_90).

qgemv's v2 kernel keeps each weight tile in registers from its load to its products, so the bytes a program has in
flight are bounded by its registers: ~4 programs an SM of one 8-16 KB tile each, and a one-row GEMV of Flash's
shapes runs at ~0.6 of the copy bandwidth (latency-bound: a program waits out a DRAM round trip per tile; session
17-19 measurements in benchmarks/RESULTS.md). Here a program owns the [BLOCK_N, K] rows of the weight and asks for
its K tiles into a ring of STAGES shared-memory slots by TMA (one thread issues a tile; an mbarrier a slot counts
its bytes), so up to STAGES tiles a program are in flight without a register each. The first STAGES tiles are
asked for before pdl_wait (a stored weight no step writes: DSV4_PDL's early loads), x only after it.

The arithmetic is a row's own, whatever the batch (a program applies each tile to its ROWS rows in turn by the
same operations): a tile [BLOCK_N, BLOCK_K] in registers as [BLOCK_N, BLOCK_K // 16, 16] (a thread holds 16
consecutive inputs of a row, one 16-byte shared load), each thread's 16 products summed in fp32 in input order,
times the 128 x 128 block's scale, added to the thread's accumulator tile by tile in K order; the threads' sums of
a row reduced at the end by a fixed butterfly. These are not v2's bits (another summation order), so the choice is
the process's (CONFIG["on"], DSV4_QGEMV_TMA), as v2 / v3 are.
"""

from __future__ import annotations

import torch

from ..formats import FP8_BLOCK, QWeight
from . import cdiv, getenv, interpreting

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError:  # no Gluon: qgemv's v2 runs
    gluon = gl = None

GPU_CHECKED = False  # not yet through a GPU run: "on" is off by default until one is recorded
# on: stored FP8 weights (not the routed experts) of a decode GEMV run here (DSV4_QGEMV_TMA=1), every row count (a
# row's bits one kernel's). block_n: rows a program (a tile [block_n, block_k] is block_n * block_k bytes);
# block_k: inputs a tile (TMA's box: at most 256 a dimension; a multiple of 16); stages: the ring's slots (a
# program's smem is stages * block_n * block_k bytes); rows: x rows a program (the weight read once for them).
CONFIG = {"on": getenv("DSV4_QGEMV_TMA", "0") == "1", "block_n": int(getenv("DSV4_QGEMV_TMA_BLOCK_N", "16")),
          "block_k": 256, "stages": int(getenv("DSV4_QGEMV_TMA_STAGES", "8")), "num_warps": 4, "rows": 8}


def _jit(fn):
    return fn if gluon is None else gluon.jit(fn)


_PDL = None
if gl is not None:
    from .moe_gl import _PDL, _pdl_wait  # noqa: F811 (one definition of the wait, moe_gl's)


@_jit
def _fp8_tma_kernel(x_ptr, w_desc, s_ptr, y_ptr, N, rows, x_stride, row_skew, K: gl.constexpr,
                    S_STRIDE: gl.constexpr, GROUP_N: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                    ROWS: gl.constexpr, STAGES: gl.constexpr):
    """Grid (row blocks, row groups): y[r, n] for n in the block and the group's ROWS rows r (the last group's
    missing rows repeat its last row: the same bits stored twice)."""
    KT: gl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
    SLOTS: gl.constexpr = STAGES if STAGES < KT else KT
    C: gl.constexpr = BLOCK_K // 16
    nb = gl.program_id(0)
    n0 = nb * BLOCK_N
    smem = gl.allocate_shared_memory(w_desc.dtype, [SLOTS, BLOCK_N, BLOCK_K], w_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(SLOTS):
        mbarrier.init(bars.index(i), count=1)
    for i in gl.static_range(SLOTS):
        mbarrier.expect(bars.index(i), w_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(w_desc, [n0, i * BLOCK_K], bars.index(i), smem.index(i))
    _pdl_wait()

    W: gl.constexpr = gl.num_warps()
    L2: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[32 // C, C],
                                        warps_per_cta=[W, 1], order=[1, 0])
    L3: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, 16], threads_per_warp=[32 // C, C, 1],
                                        warps_per_cta=[W, 1, 1], order=[2, 1, 0])
    LA: gl.constexpr = gl.SliceLayout(2, L3)  # [BLOCK_N, C]: a thread's sums
    LX: gl.constexpr = gl.SliceLayout(0, L3)  # [C, 16]: a row's inputs of the tile
    n1 = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LA))
    c1 = gl.arange(0, C, layout=gl.SliceLayout(0, LA))
    s_rows = gl.expand_dims((gl.minimum(n1, N - 1) + row_skew) // 128, 1).to(gl.int64) * S_STRIDE  # [BLOCK_N, 1]
    xc = gl.arange(0, C, layout=gl.SliceLayout(1, LX))
    xj = gl.arange(0, 16, layout=gl.SliceLayout(0, LX))
    xk = gl.expand_dims(xc, 1) * 16 + gl.expand_dims(xj, 0)  # [C, 16]
    g0 = gl.program_id(1) * ROWS
    x_base = x_ptr
    if GROUP_N > 0:
        x_base += (n0 // GROUP_N) * K
    accs = ()
    for i in gl.static_range(ROWS):
        accs = accs + (gl.zeros([BLOCK_N, C], gl.float32, LA),)
    for t in range(KT):
        slot = t % SLOTS
        mbarrier.wait(bars.index(slot), (t // SLOTS) & 1)
        wt = smem.index(slot).load(L2)
        if SLOTS < KT:  # the slot's next tile asked for once every warp has read this one
            gl.thread_barrier()
            fence_async_shared()
            nxt = t + SLOTS
            mbarrier.expect(bars.index(slot), w_desc.block_type.nbytes, pred=nxt < KT)
            tma.async_copy_global_to_shared(w_desc, [n0, nxt * BLOCK_K], bars.index(slot), smem.index(slot),
                                            pred=nxt < KT)
        w3 = gl.convert_layout(gl.reshape(wt, [BLOCK_N, C, 16]), L3).to(gl.float32)
        k0 = t * BLOCK_K
        sc = gl.load(s_ptr + s_rows + gl.expand_dims((k0 + c1 * 16) // 128, 0),
                     mask=gl.expand_dims(k0 + c1 * 16 < K, 0), other=0)
        scale = (sc.to(gl.int32) << 23).to(gl.float32, bitcast=True)
        summed = ()
        for i in gl.static_range(ROWS):
            r = gl.minimum(g0 + i, rows - 1).to(gl.int64)
            xv = gl.load(x_base + r * x_stride + k0 + xk, mask=k0 + xk < K, other=0.0).to(gl.float32)
            summed = summed + (accs[i] + gl.sum(w3 * gl.expand_dims(xv, 0), axis=2) * scale,)
        accs = summed
    for i in gl.static_range(SLOTS):
        mbarrier.invalidate(bars.index(i))
    n_out = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LA))
    for i in gl.static_range(ROWS):
        r = gl.minimum(g0 + i, rows - 1).to(gl.int64)
        out = gl.sum(accs[i], axis=1)
        gl.store(y_ptr + r * N + n_out, out.to(y_ptr.dtype.element_ty), mask=n_out < N)


_descriptors: dict = {}


def _descriptor(data: torch.Tensor, block_n: int, block_k: int):
    """The weight's TMA descriptor (unswizzled tiles: a row's 16-byte pieces read by consecutive threads), kept
    while its tensor lives at that address (the weights are stored once)."""
    key = (data.data_ptr(), tuple(data.shape), block_n, block_k)
    d = _descriptors.get(key)
    if d is None:
        layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2)
        d = _descriptors[key] = TensorDescriptor.from_tensor(data, [block_n, block_k], layout)
    return d


def chosen(x: torch.Tensor, w: QWeight, experts) -> bool:
    """Whether a GEMV of stored FP8 weight w runs here: CONFIG["on"], a CUDA x, a 2-D contiguous e4m3 weight whose
    rows are 16-byte aligned with e8m0 scales. Never the routed experts (their weights are the step's ids'). It
    depends on the weight alone, never on the rows."""
    if not CONFIG["on"] or gl is None or experts is not None or interpreting() or not x.is_cuda:
        return False
    d = w.data
    return (w.fmt == "fp8" and d.dim() == 2 and d.is_contiguous() and d.data_ptr() % 16 == 0
            and d.shape[1] % 16 == 0 and w.scale is not None and w.scale.dtype == torch.float8_e8m0fnu
            and w.scale.is_contiguous() and w.col0 % FP8_BLOCK == 0)


def _launch(kernel):
    from . import FAST_LAUNCH, fast_launch, with_pdl

    return with_pdl(fast_launch(kernel) if FAST_LAUNCH else kernel)


def launch(x: torch.Tensor, w: QWeight, y: torch.Tensor, rows: int, group_n: int = 0) -> torch.Tensor:
    """y[:rows] = x's rows times w (qgemv._launch2's contract for a stored FP8 weight; group_n: a grouped linear)."""
    c = CONFIG
    N, K = w.shape[-2], (x.shape[-1] if not group_n else w.shape[-1])
    block_n, block_k = c["block_n"], c["block_k"]
    if group_n and group_n % block_n:
        raise ValueError(f"qgemv_tma: group of {group_n} rows is not a whole number of {block_n}-row blocks")
    per_program = min(1 << (rows - 1).bit_length(), c["rows"])
    _launch(_fp8_tma_kernel)[(cdiv(N, block_n), cdiv(rows, per_program))](
        x, _descriptor(w.data, block_n, block_k), w.scale.view(torch.uint8), y, N, rows, x.stride(0),
        w.row0 % FP8_BLOCK, K=K, S_STRIDE=w.scale.shape[-1], GROUP_N=group_n, BLOCK_N=block_n, BLOCK_K=block_k,
        ROWS=per_program, STAGES=c["stages"], num_warps=c["num_warps"])
    return y
