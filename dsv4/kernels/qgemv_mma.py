"""The decode GEMV of a stored FP8 weight on the tensor cores for 1 to 8 rows alike (Gluon, mma.sync).

qgemv's two families each serve one side of the server: v2 (a row's multiply-adds on the CUDA cores) is the faster for
one row, v3 (tl.dot on 16-row tiles, the rows zero-padded) for a batch, and a request's bits must not depend on the
batch it shares, so the server runs v3 for every step: its one-row steps pay v3's one-row cost (session 24: mini's
attention +152 us a token). Here the weights are the A operand of m16n8k16 products and the step's rows (tokens) their
8 columns, so a program's cost is its weight bytes whether it serves one row or eight, and a column's sums read only
its own column of x: a row's bits are the same alone or among 7 others, in any column (moe_gl's grouped programs rely
on the same; tests/test_moe_gl.py holds them equal on the GPU).

- a program computes RT tiles of 16 output rows over a K chunk of its split: its W warps take the chunk's 64-input
  pieces in turn (U at a time, their bytes loaded before their products), lane 4 g + t loads 16 bytes (4 words) of
  rows g and g + 8 of each piece at input 16 t, and x's 16 inputs there for row (column) g of the step.
- a word's 4 e4m3 bytes become two bf16 pairs by a byte permute, a shift and masks (the value times 2**-120, exact,
  subnormals included), times the piece's block scale as a bf16 multiplier 2**(e - 7) (exact while the scales' range
  allows it: fits()), and feed one product: bytes 0, 1 the k slots 2 t, 2 t + 1, bytes 2, 3 the slots 2 t + 8, 2 t + 9,
  and x's pairs at the same inputs are the B operand as loaded (no permute: the k order is the same for A and B).
- the warps' accumulators are summed in a fixed order at the end; split-K (from the weight's shape alone) writes fp32
  partials summed in split order by the last program to finish (qgemv's tickets) or by a second launch (the same bits).

The summation order is not v2's nor v3's: this is a GEMV family of its own (qgemv CONFIG["kernel"] "mma",
DSV4_QGEMV=mma), bf16 x only (fp16 or fp32 x, or a weight whose scales fits() refuses, take v3, which is as
batch-invariant). Gluon compiles for the GPU only: on CPU the family runs v3 in Triton's interpreter, and
tests/test_qgemv_mma.py checks this kernel against the reference and row by row on the GPU.
"""

from __future__ import annotations

import torch

from ..formats import FP8_BLOCK, QWeight
from . import cdiv, getenv, gluon_launcher, interpreting
from .gluon_parts import _jit, _arange5, _mma_out_rows, _pdl_wait, _split4

try:
    from triton.experimental.gluon import language as gl
except ImportError:  # no Gluon (an older Triton, or none): v3 runs
    gl = None

GPU_CHECKED = True  # session 27 call 3: its tests, the gate and the server on mini (benchmarks/RESULTS.md); opt-in family
PIECE = 64  # inputs a lane group reads of a row at a time: 4 lanes x 16 bytes
COLUMNS = 8  # rows (tokens) a program: the n of m16n8k16
# Session 27 (benchmarks/RESULTS.md, calls 3-4), one Flash layer's FP8 linears on a rank: 1 / 8 / 16 rows 50.8 /
# 54.3 / 72.1 us (v2 44.4 / 157.4 / 273.8, v3 57.2 / 59.3 / 61.1): at 16 rows a weight is read by two programs of 8
# columns. The server on mini with it: c1 629.9, c4 1,484.0 tok/s (v3, another call: 557.8, 1,240.0).
# rt: 16-row tiles a program; warps; u: pieces a warp loads before their products; programs: split-K doubles a tile
# block's splits while the launch has fewer programs than this (each split whole steps of warps x u pieces).
CONFIG = dict(zip(("rt", "warps", "u", "programs"), (int(v) for v in getenv("DSV4_QGEMV_MMA_TILES", "1,4,4,264")
                                                     .split(","))))


_launch = gluon_launcher  # a module global: tests/compile_kernels.py replaces it to compile only


def _pair_ptx(reg: str, src: str, bytes_hi: bool) -> str:
    """PTX placing bytes 0, 1 (or 2, 3) of e4m3 word src as a bf16 pair in reg, each value times 2**-120: the byte
    to the half's high byte (prmt), its 7 magnitude bits (exponent, mantissa) down 4 to bf16's bits 4-10, its sign
    kept at bit 15. Exact: a normal e4m3 exponent field lands in bf16's exponent field, a subnormal is a bf16
    subnormal of the same digits."""
    return (f"prmt.b32 t, {src}, z, {'0x3424' if bytes_hi else '0x1404'};\nshr.b32 u, t, 4;\n"
            f"and.b32 u, u, 0x07F007F0;\nand.b32 t, t, 0x80008000;\nor.b32 {reg}, u, t;\n")


# One word (4 inputs) of rows g and g + 8: $4, $5 the words, $6 the pair multiplier (bf16 2**(e - 7), twice), $7, $8
# x's pairs (inputs 0, 1 and 2, 3 of the word) for column g, $9-$12 the accumulator in; $0-$3 out (rows g, g, g + 8,
# g + 8; columns 2 t, 2 t + 1).
_MMA_WORD_PTX = ("{\n.reg .b32 t, u, z, a0, a1, a2, a3;\nmov.b32 z, 0;\n"
                 + _pair_ptx("a0", "$4", False) + "mul.rn.bf16x2 a0, a0, $6;\n"
                 + _pair_ptx("a1", "$5", False) + "mul.rn.bf16x2 a1, a1, $6;\n"
                 + _pair_ptx("a2", "$4", True) + "mul.rn.bf16x2 a2, a2, $6;\n"
                 + _pair_ptx("a3", "$5", True) + "mul.rn.bf16x2 a3, a3, $6;\n"
                 + "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {$0, $1, $2, $3}, {a0, a1, a2, a3}, "
                   "{$7, $8}, {$9, $10, $11, $12};\n}")
if gl is not None:
    _MMA_WORD_PTX = gl.constexpr(_MMA_WORD_PTX)


@_jit
def _mma_word(wg, wh, m, x_lo, x_hi, c):
    return gl.inline_asm_elementwise(_MMA_WORD_PTX, "=f,=f,=f,=f,r,r,r,r,r,f,f,f,f",
                                     [wg, wh, m, x_lo, x_hi, c[0], c[1], c[2], c[3]], dtype=(gl.float32,) * 4,
                                     is_pure=True, pack=1)


@_jit
def _piece(w_words, s_ptr, m_row, s_row, c, K: gl.constexpr, S_STRIDE: gl.constexpr):
    """Piece c's stored words of rows m_row and m_row + 8 ([.., 4] each: a lane's 16 bytes) and its multiplier."""
    at = m_row * (K // 4) + c * 16
    e = gl.load(s_ptr + s_row * S_STRIDE + c // 2).to(gl.int32)
    return gl.load(w_words + at), gl.load(w_words + at + 8 * (K // 4)), (e + 120) * 0x00800080


@_jit
def _qgemv_mma_kernel(x_ptr, w_ptr, s_ptr, y_ptr, p_ptr, tickets_ptr, N, rows, x_stride, row_skew, K: gl.constexpr,
                      S_STRIDE: gl.constexpr, GROUP_N: gl.constexpr, RT: gl.constexpr, U: gl.constexpr,
                      K_CHUNK: gl.constexpr, SPLITS: gl.constexpr, FUSED_SUM: gl.constexpr):
    """Grid (N / (16 RT), SPLITS, row groups of 8): outputs nb * 16 RT.. of rows (columns) 8 group.. over inputs
    split * K_CHUNK.. (GROUP_N: output rows in groups of GROUP_N, group g reading x's g-th K-wide slice). SPLITS > 1:
    fp32 partials [rows, SPLITS, N] at p_ptr, summed by the last program (FUSED_SUM) or by qgemv.sum_splits."""
    W: gl.constexpr = gl.num_warps()
    L5: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, RT, 1, 1, 4], threads_per_warp=[1, 1, 8, 4, 1],
                                        warps_per_cta=[W, 1, 1, 1, 1], order=[4, 3, 2, 1, 0])
    L4: gl.constexpr = gl.SliceLayout(4, L5)
    nb = gl.program_id(0)
    split = gl.program_id(1)
    group = gl.program_id(2)
    kw = _arange5(W, 0, L5)
    g = _arange5(8, 2, L5)
    t = _arange5(4, 3, L5)
    i = _arange5(4, 4, L5)
    m_row = (nb * (16 * RT) + _arange5(RT, 1, L5) * 16 + g).to(gl.int64)  # [1, RT, 8, 1, 1]
    s_row = ((m_row + row_skew) // 128) + 0 * t  # a 16-row tile never straddles a scale block
    w_words = w_ptr.to(gl.pointer_type(gl.int32), bitcast=True) + t * 4 + i
    cols = gl.minimum(rows - group * 8, 8)
    x_live = (g < cols) & (kw >= 0) & (i >= 0) & (t >= 0)
    x_group = x_ptr
    if GROUP_N > 0:
        x_group += ((nb * (16 * RT)) // GROUP_N) * K
    x_words = (x_group + (group * 8 + g).to(gl.int64) * x_stride).to(gl.pointer_type(gl.int32), bitcast=True) \
        + t * 8 + i
    p0 = split * (K_CHUNK // 64)  # 64: PIECE
    zero = gl.zeros([W, RT, 8, 4], gl.float32, L4)
    acc = (zero, zero, zero, zero)
    # The first step's weights (stored bytes, which no kernel writes) asked for before the wait
    first = ()
    for j in gl.static_range(U):
        first = first + (_piece(w_words, s_ptr, m_row, s_row, p0 + j * W + kw, K, S_STRIDE),)
    _pdl_wait()
    acc = _step(acc, first, x_words, x_live, p0, kw, W, U, L4)
    for c0 in range(W * U, K_CHUNK // 64, W * U):
        loads = ()
        for j in gl.static_range(U):
            loads = loads + (_piece(w_words, s_ptr, m_row, s_row, p0 + c0 + j * W + kw, K, S_STRIDE),)
        acc = _step(acc, loads, x_words, x_live, p0 + c0, kw, W, U, L4)
    _store(acc, y_ptr, p_ptr, tickets_ptr, nb, split, group, rows, N, RT, SPLITS, FUSED_SUM)


@_jit
def _step(acc, loads, x_words, x_live, c0, kw, W: gl.constexpr, U: gl.constexpr, L4: gl.constexpr):
    """acc plus a step's products: U pieces (c0 + j W + the warp's, their weights and multipliers loaded), x's
    pairs of each loaded for the lanes' columns, a word of rows g and g + 8 one m16n8k16 product."""
    xs = ()
    for j in gl.static_range(U):
        c = c0 + j * W + kw
        xs = xs + ((gl.load(x_words + c * 32, mask=x_live, other=0), gl.load(x_words + c * 32 + 4, mask=x_live,
                                                                             other=0)),)
    for j in gl.static_range(U):
        wg, wh, m = loads[j]
        wg4 = _split4(wg, L4)
        wh4 = _split4(wh, L4)
        m4 = gl.convert_layout(gl.sum(m, axis=4), L4)  # [.., 1] -> [..]: the same value (gl.max there fails to lower)
        xa4 = _split4(xs[j][0], L4)
        xb4 = _split4(xs[j][1], L4)
        acc = _mma_word(wg4[0], wh4[0], m4, xa4[0], xa4[1], acc)
        acc = _mma_word(wg4[1], wh4[1], m4, xa4[2], xa4[3], acc)
        acc = _mma_word(wg4[2], wh4[2], m4, xb4[0], xb4[1], acc)
        acc = _mma_word(wg4[3], wh4[3], m4, xb4[2], xb4[3], acc)
    return acc


@_jit
def _store(acc, y_ptr, p_ptr, tickets_ptr, nb, split, group, rows, N, RT: gl.constexpr, SPLITS: gl.constexpr,
           FUSED_SUM: gl.constexpr):
    """The warps' sums (in warp order) of the four accumulators (rows g, g, g + 8, g + 8 of each tile; columns 2 t,
    2 t + 1): y, or this split's fp32 partials and, FUSED_SUM, the last program's sum in split order."""
    m3, t3 = _mma_out_rows(nb, RT)
    dt: gl.constexpr = y_ptr.dtype.element_ty
    sums = (gl.sum(acc[0], axis=0), gl.sum(acc[1], axis=0), gl.sum(acc[2], axis=0), gl.sum(acc[3], axis=0))
    for q in gl.static_range(4):
        r = group * 8 + 2 * t3 + (q % 2)  # the column's row of x and y
        m = m3 + 8 * (q // 2)
        live = r < rows
        if SPLITS == 1:
            gl.store(y_ptr + r.to(gl.int64) * N + m, sums[q].to(dt), mask=live)
        else:
            gl.store(p_ptr + (r.to(gl.int64) * SPLITS + split) * N + m, sums[q], mask=live)
    if SPLITS > 1:
        if FUSED_SUM:
            ticket = tickets_ptr + group * gl.num_programs(0) + nb
            gl.thread_barrier()  # every thread's partials stored before the ticket's release
            if gl.atomic_add(ticket, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:
                for q in gl.static_range(4):
                    r = group * 8 + 2 * t3 + (q % 2)
                    m = m3 + 8 * (q // 2)
                    live = r < rows
                    total = gl.zeros_like(sums[q])
                    for sp in gl.static_range(SPLITS):  # from zero, in split order: qgemv.sum_splits' operations
                        total += gl.load(p_ptr + (r.to(gl.int64) * SPLITS + sp) * N + m, mask=live, other=0.0,
                                         cache_modifier=".cg")
                    gl.store(y_ptr + r.to(gl.int64) * N + m, total.to(dt), mask=live)
                gl.store(ticket, 0)


def fits(x: torch.Tensor, w: QWeight, group_n: int = 0) -> bool:
    """Whether the mma family's GEMV of x by w runs here (else v3): Gluon, a CUDA bf16 x [rows, K] with unit stride, a
    stored FP8 weight [N, K] (not the routed experts') with e8m0 scales in the range that keeps its products exact
    (the multiplier 2**(e - 7) a normal bf16, the weights' digits inside bf16's: 3 <= e <= 134), K a multiple of a
    step's pieces, N (and a group's rows) of a program's tiles, a rank's rows starting on a tile. It depends on the
    weight and x's type only, never on the rows. The scales' range is read once (a host read, kept on the scale
    tensor): the first step that asks must not be a graph capture (a capture's warm-up steps run eagerly first)."""
    c = CONFIG
    if not (gl is not None and x.is_cuda and not interpreting() and x.dtype == torch.bfloat16 and x.dim() == 2
            and x.stride(1) == 1 and w.fmt == "fp8" and w.data.dim() == 2 and w.data.is_contiguous()
            and w.scale is not None and w.scale.dtype == torch.float8_e8m0fnu and w.scale.is_contiguous()
            and w.col0 % FP8_BLOCK == 0 and w.row0 % 16 == 0 and w.shape[1] % (PIECE * c["warps"] * c["u"]) == 0
            and w.shape[0] % (16 * c["rt"]) == 0 and (not group_n or group_n % (16 * c["rt"]) == 0)):
        return False
    span = getattr(w.scale, "_dsv4_mma_span", None)
    if span is None:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("qgemv mma: the weight scales' range check (a host read) would run inside a graph "
                               "capture; run one eager step first")
        e = w.scale.view(torch.uint8)
        span = w.scale._dsv4_mma_span = (int(e.min()), int(e.max()))
    return 3 <= span[0] and span[1] <= 134


def splits(N: int, K: int) -> int:
    """A tile block's programs along K, from the weight's shape alone: doubled from 1 while the launch has fewer than
    CONFIG["programs"] programs and each split keeps whole steps (warps x u pieces)."""
    c = CONFIG
    blocks, steps = N // (16 * c["rt"]), K // (PIECE * c["warps"] * c["u"])
    s = 1
    while steps % (2 * s) == 0 and blocks * s < c["programs"]:
        s *= 2
    return s


def launch(x: torch.Tensor, w: QWeight, y: torch.Tensor, rows: int, group_n: int,
           tickets: torch.Tensor | None) -> torch.Tensor | None:
    """y [rows, N] = x's rows times w (grouped by group_n where > 0), as fits() allows, in one launch: None. With
    splits and no tickets the fp32 partials [rows, splits, N] are returned unsummed, for qgemv.sum_splits."""
    N, K = w.shape
    c = CONFIG
    s = splits(N, K)
    partials = torch.empty(rows, s, N, dtype=torch.float32, device=x.device) if s > 1 else y
    _launch(_qgemv_mma_kernel)[(N // (16 * c["rt"]), s, cdiv(rows, COLUMNS))](
        x, w.data, w.scale.view(torch.uint8), y, partials, tickets if tickets is not None else partials, N, rows,
        x.stride(0), w.row0 % FP8_BLOCK, K=K, S_STRIDE=w.scale.shape[-1], GROUP_N=group_n, RT=c["rt"], U=c["u"],
        K_CHUNK=K // s, SPLITS=s, FUSED_SUM=tickets is not None, num_warps=c["warps"])
    return partials if s > 1 and tickets is None else None
