"""The decode GEMV of a stored FP8 weight on the CUDA cores, the registers laid out by hand (Gluon).

qgemv's v2 family computes y = W x for one to eight rows from the e4m3 bytes and their 128 x 128 block scales (ue8m0).
Its Triton form streams a Flash layer's attention linears at 0.44-0.71 of the copy bandwidth (benchmarks/RESULTS.md,
sessions 19-25; ncu at a rank's wo_b: DRAM 37 % of its peak, half of a warp's cycles waiting on loads): a program's
weight bytes arrive a tile at a time, each after the tile before is summed. Here a program's whole K chunk (STEPS
steps of 512 inputs) is asked for at once, before the program waits for the kernel before it (DSV4_PDL: the weights
are stored, no kernel writes them), so that the bytes of every step are in flight together, and only then are x and
the sums touched:

- a program's tile is [BLOCK_N = RN x warps outputs, 32 lanes, 16 inputs]: a thread holds RN rows of 16 consecutive
  inputs (one 16-byte load a row and step), the 32 lanes of a warp 512 contiguous bytes of each row, the warps
  rows (moe_gl's shared-expert layout); a thread's 16 inputs share one block scale.
- each step: the e4m3 bytes widened to fp32, each row's 16 products summed in the thread (fp32), times the
  block's scale, added to the lane's accumulator; after the last step the 32 lanes' sums by a fixed butterfly.
- split-K (SPLITS programs a row block, from the weight's shape alone): fp32 partials, summed in split order by
  the last program of the (row group, row block) to finish (an int32 ticket, qgemv's tickets), as v2's fused sum.
- ROWS rows of a batched step share a program: each step's tile is read and widened once for them, and each row's
  sums are the operations it gets alone (its own products, in the same order): a row's bits never depend on the
  batch.

The summation order is not v2's (another layout), so like v2 / v3 it is the process's choice (CONFIG["on"],
DSV4_QGEMV_GL=1: off by default until the GPU runs it). Gluon compiles for the GPU only: on CPU qgemv's kernels run,
and tests/test_qgemv_gl.py checks this one against the dequantised reference and row by row on the GPU.
"""

from __future__ import annotations

import torch

from ..formats import FP8_BLOCK, QWeight
from . import PDL, cdiv, getenv, gluon_launcher, interpreting

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
except ImportError:  # no Gluon (an older Triton, or none): qgemv's kernels run
    gluon, gl = None, None

GPU_CHECKED = False  # not yet run on a GPU: DSV4_QGEMV_GL=1 only
STEP = 512  # inputs a K step: 32 lanes x 16
# on: the v2 family's FP8 GEMVs of stored weights run here (DSV4_QGEMV_GL=1; off by default). rows_per_thread (RN) x
# num_warps = outputs a program; programs: split-K doubles a row block's splits while the launch has fewer programs
# than this (and each split keeps at least one step), as qgemv.splits_for.
# DSV4_QGEMV_GL_TILES="RN,warps,programs,max_steps" sets the four (a benchmark's arms; spawned ranks read it too).
CONFIG = {"on": getenv("DSV4_QGEMV_GL", "0") == "1",
          **dict(zip(("rows_per_thread", "num_warps", "programs", "max_steps"),
                     (int(v) for v in getenv("DSV4_QGEMV_GL_TILES", "2,4,528,4").split(","))))}


def _jit(fn=None, **options):
    if fn is None:
        return lambda f: _jit(f, **options)
    return fn if gluon is None else gluon.jit(fn, **options)


_PDL = gl.constexpr(PDL) if gl is not None else PDL
_launch = gluon_launcher  # a module global: tests/compile_kernels.py replaces it to compile only


@_jit
def _pdl_wait():
    """dsv4.kernels.pdl_wait in Gluon (as moe_gl's): the kernel before complete and its writes visible, then the
    next one released."""
    if _PDL:
        gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)


@_jit
def _qgemv_gl_kernel(x_ptr, w_ptr, s_ptr, y_ptr, p_ptr, tickets_ptr, N, rows, x_stride, row_skew, K: gl.constexpr,
                     S_STRIDE: gl.constexpr, GROUP_N: gl.constexpr, RN: gl.constexpr, STEPS: gl.constexpr,
                     SPLITS: gl.constexpr, ROWS: gl.constexpr, FUSED_SUM: gl.constexpr):
    """Grid (N / BLOCK_N row blocks, SPLITS, row groups of ROWS): outputs nb * BLOCK_N.. of rows group * ROWS..
    (past the last row, the last row again: the same bits stored twice) over inputs split * STEPS * 512.. (GROUP_N:
    output rows in groups of GROUP_N, group g reading x's g-th K-wide slice). SPLITS > 1: fp32 partials
    [rows, SPLITS, N] at p_ptr, summed by the last program (_split_sum, FUSED_SUM) or by qgemv's
    _sum_splits_kernel after this launch (the same operations: the same bits)."""
    G: gl.constexpr = 32
    LF: gl.constexpr = gl.BlockedLayout(size_per_thread=[RN, 1, 16], threads_per_warp=[1, 32, 1],
                                        warps_per_cta=[gl.num_warps(), 1, 1], order=[2, 1, 0])
    L2: gl.constexpr = gl.SliceLayout(2, LF)
    LN: gl.constexpr = gl.SliceLayout(1, L2)
    BLOCK_N: gl.constexpr = RN * gl.num_warps()
    nb = gl.program_id(0)
    split = gl.program_id(1)
    group = gl.program_id(2)
    n1 = nb * BLOCK_N + gl.arange(0, BLOCK_N, layout=LN)
    g1 = gl.arange(0, G, layout=gl.SliceLayout(0, L2))
    j1 = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, LF)))
    n3 = gl.expand_dims(gl.expand_dims(n1, 1), 2).to(gl.int64)
    k3 = gl.expand_dims(gl.expand_dims(g1, 0), 2) * 16 + gl.expand_dims(gl.expand_dims(j1, 0), 1)  # [1, G, 16]
    s_rows = gl.expand_dims(((n1 + row_skew) // 128).to(gl.int64), 1) * S_STRIDE  # [BLOCK_N, 1]
    g2 = gl.expand_dims(g1, 0)
    k_lo = split * (STEPS * 512)
    # The whole chunk's weights and scales asked for first: stored bytes, which no kernel writes, so before the wait
    wq = ()
    sq = ()
    for st in gl.static_range(STEPS):
        k0 = k_lo + st * 512
        wq = wq + (gl.load(w_ptr + n3 * K + k0 + k3),)
        sq = sq + (gl.load(s_ptr + s_rows + (k0 + g2 * 16) // 128),)
    _pdl_wait()
    x_group = x_ptr
    if GROUP_N > 0:
        x_group += ((nb * BLOCK_N) // GROUP_N) * K
    accs = ()
    for i in gl.static_range(ROWS):
        accs = accs + (gl.zeros([BLOCK_N, G], gl.float32, L2),)
    for st in gl.static_range(STEPS):
        k0 = k_lo + st * 512
        wv = wq[st].to(gl.float32)
        sc = (sq[st].to(gl.int32) << 23).to(gl.float32, bitcast=True)
        summed = ()
        for i in gl.static_range(ROWS):
            r = gl.minimum(group * ROWS + i, rows - 1).to(gl.int64)
            xv = gl.load(x_group + r * x_stride + k0 + k3).to(gl.float32)
            summed = summed + (accs[i] + gl.sum(wv * xv, axis=2) * sc,)
        accs = summed
    dt: gl.constexpr = y_ptr.dtype.element_ty
    if SPLITS == 1:
        for i in gl.static_range(ROWS):
            r = gl.minimum(group * ROWS + i, rows - 1).to(gl.int64)
            gl.store(y_ptr + r * N + n1, gl.sum(accs[i], axis=1).to(dt))
    else:
        for i in gl.static_range(ROWS):
            r = gl.minimum(group * ROWS + i, rows - 1).to(gl.int64)
            gl.store(p_ptr + (r * SPLITS + split) * N + n1, gl.sum(accs[i], axis=1))
        if FUSED_SUM:
            _split_sum(p_ptr, y_ptr, tickets_ptr + group * gl.num_programs(0) + nb, group, rows, n1, N, SPLITS, ROWS)


@_jit
def _split_sum(p_ptr, y_ptr, ticket, group, rows, n1, N, SPLITS: gl.constexpr, ROWS: gl.constexpr):
    """The last of a (row group, row block)'s SPLITS programs to finish sums each row's partials in split order
    0..SPLITS-1 from zero, as qgemv's _sum_splits_kernel (the same bits whichever came last), stores y in its dtype and puts the ticket back to 0. The
    barrier makes every thread's partials stored before the release; the loads go to L2 (.cg): other SMs wrote
    them."""
    dt: gl.constexpr = y_ptr.dtype.element_ty
    gl.thread_barrier()
    if gl.atomic_add(ticket, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:
        for i in gl.static_range(ROWS):
            r = gl.minimum(group * ROWS + i, rows - 1).to(gl.int64)
            total = gl.zeros_like(n1.to(gl.float32))
            for sp in gl.static_range(SPLITS):
                total += gl.load(p_ptr + (r * SPLITS + sp) * N + n1, cache_modifier=".cg")
            gl.store(y_ptr + r * N + n1, total.to(dt))
        gl.store(ticket, 0)


def _block_n() -> int:
    return CONFIG["rows_per_thread"] * CONFIG["num_warps"]


def chosen(x: torch.Tensor, w: QWeight, rows: int, group_n: int = 0) -> bool:
    """Whether the v2 family's GEMV of x's rows by w runs here: CONFIG["on"], a CUDA x [rows, K] in bf16/fp16, a
    stored FP8 weight [N, K] (not the routed experts') with e8m0 scales, K a multiple of 512 and N (and a group's
    rows) of a program's. It depends on the weight and x's type only, never on the rows: a row's bits are one
    kernel's, whatever the batch."""
    block_n = _block_n()
    return (CONFIG["on"] and gl is not None and x.is_cuda and not interpreting()
            and x.dtype in (torch.bfloat16, torch.float16) and x.dim() == 2 and x.stride(1) == 1
            and w.fmt == "fp8" and w.data.dim() == 2 and w.data.is_contiguous() and w.scale is not None
            and w.scale.dtype == torch.float8_e8m0fnu and w.scale.is_contiguous() and w.col0 % FP8_BLOCK == 0
            and w.shape[1] % STEP == 0 and w.shape[0] % block_n == 0 and (not group_n or group_n % block_n == 0))


def splits(N: int, K: int) -> int:
    """A row block's programs along K, from the weight's shape alone: doubled from 1 while the launch has fewer
    than CONFIG["programs"] programs or a program more than CONFIG["max_steps"] steps, each split whole steps."""
    blocks, steps = N // _block_n(), K // STEP
    s = 1
    while steps % (2 * s) == 0 and (blocks * s < CONFIG["programs"] or steps // s > CONFIG["max_steps"]):
        s *= 2
    return s


def block_n() -> int:
    """Outputs a program computes."""
    return _block_n()


def launch(x: torch.Tensor, w: QWeight, y: torch.Tensor, rows: int, group_n: int, rows_per_program: int,
           tickets: torch.Tensor | None) -> torch.Tensor | None:
    """y [rows, N] = x's rows times w (grouped by group_n where > 0), as chosen() allows, in one launch: None. With
    splits (splits()) and no tickets (qgemv.tickets_for's: a capture before any eager launch) the fp32 partials
    [rows, splits, N] are returned unsummed, for the caller's second launch (qgemv.sum_splits: the same bits)."""
    N, K = w.shape
    s = splits(N, K)
    partials = torch.empty(rows, s, N, dtype=torch.float32, device=x.device) if s > 1 else y
    _launch(_qgemv_gl_kernel)[(N // _block_n(), s, cdiv(rows, rows_per_program))](
        x, w.data, w.scale.view(torch.uint8), y, partials, tickets if tickets is not None else partials, N, rows,
        x.stride(0), w.row0 % FP8_BLOCK, K=K, S_STRIDE=w.scale.shape[-1], GROUP_N=group_n,
        RN=CONFIG["rows_per_thread"], STEPS=K // STEP // s, SPLITS=s, ROWS=rows_per_program,
        FUSED_SUM=tickets is not None, num_warps=CONFIG["num_warps"])
    return partials if s > 1 and tickets is None else None
