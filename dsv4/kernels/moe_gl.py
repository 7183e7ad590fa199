"""The routed experts of a decode step on the CUDA cores, with the registers laid out by hand (Gluon).

dsv4.kernels.moe's pair kernels, two launches a layer: kernel 1 (_gate_up_kernel) the gate and up projections
of each (token, selected expert) pair read from their stored FP4 bytes plus the SwiGLU activation, kernel 2
(_down_kernel) each pair's down projection times its routing weight, the k terms of a token summed in routing
order (plus the shared expert's output). The arithmetic is moe's (fp32 sums, the reference's roundings), the
tile is laid out so that nothing but the weights moves:

- a program's tile is [BLOCK_N outputs, G groups of 32 inputs, 4 int32 words]: a thread holds RN outputs of
  one group, that is 4 consecutive words of each of its rows (one 16-byte load a row) and one scale a row; the
  32 lanes of a warp take 32 consecutive groups (1,024 inputs: 512 contiguous bytes a row), the warps take
  rows. A thread's 32 inputs are the same for its RN rows (and for gate and up): each is loaded and widened
  once for 2 RN products.
- a word's 8 nibbles are decoded by inline PTX: nibbles q and q + 4 of a word sit 16 bits apart, so two
  shifts and two masks place both in an fp16 pair (e2m1 times 2**-14, exact; subnormal 0.5 included), and
  each half widens to fp32 in one instruction (HADD2.F32), no byte permutes.
- no shared memory and no barrier in the K loop: Triton's own layout for moe's tile (sass_census: 20 barriers
  and 8 shared-memory round trips a K step for the broadcast of x) is what this module replaces.

The sums are fp32 in a fixed order (per word the nibbles 0, 4, 1, 5, 2, 6, 3, 7; a group's four words; the
group's scale; the groups of a lane in K order; then the lanes' sums by a fixed butterfly): a pair's bits
depend on its own row only, never on the batch, but they are not moe's bits (another summation order). So
the choice is the process's (CONFIG["on"], DSV4_MOE_GLUON), like the GEMVs' v2 / v3.

Gluon compiles for the GPU only (Triton's interpreter does not run it): on CPU the model keeps moe's kernels,
and tests/test_moe_gl.py checks these against moe's on the GPU.
"""

from __future__ import annotations

import os

import torch

from ..formats import QWeight
from . import cdiv, getenv, launcher

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
except ImportError:  # no Gluon (an older Triton, or none): moe's kernels run
    gluon, gl = None, None

GPU_CHECKED = False  # not yet run on a GPU
# on: DSV4_MOE_GLUON=1 takes a decode step's routed experts here (FP4 experts, bf16/fp16 activations).
# rows_per_thread (RN) x warps = outputs a program; the K step is 1,024 inputs (32 lanes x 32).
CONFIG = {"on": getenv("DSV4_MOE_GLUON", "0") == "1", "rows_per_thread": 4, "num_warps": 4}


def _jit(fn):
    return fn if gluon is None else gluon.jit(fn)


# Nibbles q and q + 4 of an int32 word as an fp16 pair: magnitude (bits 4q..4q+2) to fp16 bits 9-11, sign (bit
# 4q+3) to bit 15; the high nibble lands 16 bits up. Shifts left by (9 - 4q, 12 - 4q); q = 3 shifts right by 3.
_DECODE_PTX = """{
.reg .b32 m, s, t;
.reg .b16 lo, hi;
""" + "".join(f"""{"shl" if q < 3 else "shr"}.b32 m, $8, {abs(9 - 4 * q)};
and.b32 m, m, 0x0E000E00;
{"shl.b32 s, $8, " + str(12 - 4 * q) + ";" if q < 3 else "mov.b32 s, $8;"}
and.b32 s, s, 0x80008000;
or.b32 t, m, s;
mov.b32 {{lo, hi}}, t;
cvt.f32.f16 ${2 * q}, lo;
cvt.f32.f16 ${2 * q + 1}, hi;
""" for q in range(4)) + "}"
if gl is not None:
    _DECODE_PTX = gl.constexpr(_DECODE_PTX)


@_jit
def _decode(words):
    """int32 words -> their 8 nibbles' e2m1 values times 2**-14 as fp32, in the order 0, 4, 1, 5, 2, 6, 3, 7."""
    return gl.inline_asm_elementwise(_DECODE_PTX, "=r,=r,=r,=r,=r,=r,=r,=r,r", [words], dtype=(gl.float32,) * 8,
                                     is_pure=True, pack=1)


@_jit
def _fp4_tile(w, s, n3, g3, w3, ng, gg, kg, K: gl.constexpr, S_STRIDE: gl.constexpr):
    """A K step's int32 words [BLOCK_N, G, 4] and scales [BLOCK_N, G] (fp32, times 2**14) of rows n of an FP4
    weight, from group kg on. A row past the weight's (masked by the caller's n) reads nothing."""
    words = gl.load(w + n3 * (K // 8) + (kg + g3) * 4 + w3)
    sc = gl.load(s + ng * S_STRIDE + kg + gg)
    return words, (sc.to(gl.int32) << 23).to(gl.float32, bitcast=True) * 16384.0


@_jit
def _x_step(x_row, kg, G: gl.constexpr, L3: gl.constexpr):
    """The step's inputs x[32 (kg + g) + 8 w + q] as 8 fp32 tensors [1, G, 4], q in the decode's nibble order:
    a thread loads its group's 32 inputs (four 16-byte loads) and keeps them in its registers."""
    LX: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4, 8], threads_per_warp=[32, 1, 1],
                                        warps_per_cta=[1, 1, gl.num_warps()], order=[2, 1, 0])
    g = gl.arange(0, G, layout=gl.SliceLayout(1, gl.SliceLayout(2, LX)))
    w = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, LX)))
    q = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, LX)))
    at = (gl.expand_dims(gl.expand_dims(g, 1), 2) * 32 + gl.expand_dims(gl.expand_dims(w, 0), 2) * 8
          + gl.expand_dims(gl.expand_dims(q, 0), 1))
    xv = gl.load(x_row + kg * 32 + at).to(gl.float32)
    even, odd = gl.split(gl.reshape(xv, [G, 4, 4, 2]))  # q = 2 a + b
    e0, e4, e2, e6 = _quarters(even)  # q = 0, 4, 2, 6
    o1, o5, o3, o7 = _quarters(odd)  # q = 1, 5, 3, 7
    return (_x_slice(e0, L3), _x_slice(e4, L3), _x_slice(o1, L3), _x_slice(o5, L3), _x_slice(e2, L3),
            _x_slice(e6, L3), _x_slice(o3, L3), _x_slice(o7, L3))


@_jit
def _quarters(xa):
    """[G, 4, 4] (a = 2 c + d) -> its a = 0, 2, 1, 3 slices [G, 4]."""
    d0, d1 = gl.split(gl.reshape(xa, [xa.shape[0], 4, 2, 2]))
    a0, a2 = gl.split(d0)
    a1, a3 = gl.split(d1)
    return a0, a2, a1, a3


@_jit
def _x_slice(xq, L3: gl.constexpr):
    """[G, 4] -> [1, G, 4] in the tile's layout (the same registers: no data moves)."""
    return gl.expand_dims(gl.convert_layout(xq, gl.SliceLayout(0, L3)), 0)


@_jit
def _fp4_sum(acc, words, sc, xq):
    """acc [BLOCK_N, G] plus the step's products: each word's 8 nibbles times their x (xq, _x_step's) in the order
    0, 4, 1, 5, 2, 6, 3, 7 (fp32 multiply-adds), a group's 4 words summed, times the group's scale."""
    v = _decode(words)
    part = v[0] * xq[0]
    for i in gl.static_range(1, 8):
        part = part + v[i] * xq[i]
    return acc + gl.sum(part, axis=2) * sc


@_jit
def _gate_up_gl_kernel(x_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, ids_ptr, h_ptr, I, first, n_local, w_expert_stride,
                    s_expert_stride, limit, K: gl.constexpr, S_STRIDE: gl.constexpr, TOPK: gl.constexpr,
                    RN: gl.constexpr):
    """Grid (I / BLOCK_N, T * TOPK): program (nb, r) the gate and up sums of outputs nb * BLOCK_N.. of pair r
    (token r // TOPK, local expert ids[r] - first; another rank's expert: nothing), then moe's activation into
    h [T * TOPK, I]."""
    G: gl.constexpr = 32
    L3: gl.constexpr = gl.BlockedLayout(size_per_thread=[RN, 1, 4], threads_per_warp=[1, 32, 1],
                                        warps_per_cta=[gl.num_warps(), 1, 1], order=[2, 1, 0])  # see the docstring
    BLOCK_N: gl.constexpr = RN * gl.num_warps()
    nb = gl.program_id(0)
    r = gl.program_id(1).to(gl.int64)
    e = gl.load(ids_ptr + r).to(gl.int64) - first
    if (e >= 0) & (e < n_local):
        L2: gl.constexpr = gl.SliceLayout(2, L3)
        n1 = nb * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))
        g1 = gl.arange(0, G, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
        w1d = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
        n3 = gl.expand_dims(gl.expand_dims(n1, 1), 2).to(gl.int64)
        g3 = gl.expand_dims(gl.expand_dims(g1, 0), 2)
        w3 = gl.expand_dims(gl.expand_dims(w1d, 0), 1)
        ng = gl.expand_dims(n1, 1).to(gl.int64)
        gg = gl.expand_dims(g1, 0)
        xg = g3 * 32 + w3 * 8
        w1, s1 = w1_ptr + e * w_expert_stride, s1_ptr + e * s_expert_stride
        w3p, s3 = w3_ptr + e * w_expert_stride, s3_ptr + e * s_expert_stride
        x_row = x_ptr + (r // TOPK) * K
        acc_g = gl.zeros([BLOCK_N, G], gl.float32, L2)
        acc_u = gl.zeros([BLOCK_N, G], gl.float32, L2)
        for kg in range(0, K // 32, G):
            wg, sg = _fp4_tile(w1, s1, n3, g3, w3, ng, gg, kg, K, S_STRIDE)
            wu, su = _fp4_tile(w3p, s3, n3, g3, w3, ng, gg, kg, K, S_STRIDE)
            xq = _x_step(x_row, kg, G, L3)
            acc_g = _fp4_sum(acc_g, wg, sg, xq)
            acc_u = _fp4_sum(acc_u, wu, su, xq)
        gate = gl.sum(acc_g, axis=1)
        up = gl.sum(acc_u, axis=1)
        dt: gl.constexpr = h_ptr.dtype.element_ty
        gate = gl.minimum(gate.to(dt).to(gl.float32), limit)
        up = gl.minimum(gl.maximum(up.to(dt).to(gl.float32), -limit), limit)
        act = (gate / (1.0 + gl.exp(-gate))).to(dt).to(gl.float32)
        gl.store(h_ptr + r * I + n1, (act * up).to(dt))


@_jit
def _down_gl_kernel(h_ptr, w_ptr, s_ptr, ids_ptr, wt_ptr, add_ptr, y_ptr, p_ptr, tickets_ptr, D, first, n_local,
                 w_expert_stride, s_expert_stride, I: gl.constexpr, S_STRIDE: gl.constexpr, TOPK: gl.constexpr,
                 ADD: gl.constexpr, RN: gl.constexpr, FUSED_SUM: gl.constexpr):
    """Grid (D / BLOCK_N, T, TOPK): program (nb, t, j) stores pair t * TOPK + j's term, its down projection rounded
    times its routing weight rounded (0 for another rank's expert), into p [T, TOPK, D] (fp32); the last of a
    (t, nb)'s TOPK programs (an int32 ticket) sums the terms in routing order, then moe's store (with ADD, the
    sum rounded plus add[t], rounded again). moe._down_split_kernel's arithmetic, this module's tile. Without
    FUSED_SUM no tickets: moe._down_sum_kernel sums the terms in a second launch (the same operations, bits)."""
    G: gl.constexpr = 32
    L3: gl.constexpr = gl.BlockedLayout(size_per_thread=[RN, 1, 4], threads_per_warp=[1, 32, 1],
                                        warps_per_cta=[gl.num_warps(), 1, 1], order=[2, 1, 0])  # see the docstring
    BLOCK_N: gl.constexpr = RN * gl.num_warps()
    L2: gl.constexpr = gl.SliceLayout(2, L3)
    LN: gl.constexpr = gl.SliceLayout(1, L2)
    nb = gl.program_id(0)
    t = gl.program_id(1).to(gl.int64)
    j = gl.program_id(2)
    r = t * TOPK + j
    n1 = nb * BLOCK_N + gl.arange(0, BLOCK_N, layout=LN)
    dt: gl.constexpr = y_ptr.dtype.element_ty
    e = gl.load(ids_ptr + r).to(gl.int64) - first
    term = gl.zeros([BLOCK_N], gl.float32, LN)
    if (e >= 0) & (e < n_local):
        g1 = gl.arange(0, G, layout=gl.SliceLayout(0, L2))
        w1d = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
        n3 = gl.expand_dims(gl.expand_dims(n1, 1), 2).to(gl.int64)
        g3 = gl.expand_dims(gl.expand_dims(g1, 0), 2)
        w3 = gl.expand_dims(gl.expand_dims(w1d, 0), 1)
        ng = gl.expand_dims(n1, 1).to(gl.int64)
        gg = gl.expand_dims(g1, 0)
        w, s = w_ptr + e * w_expert_stride, s_ptr + e * s_expert_stride
        h_row = h_ptr + r * I
        acc = gl.zeros([BLOCK_N, G], gl.float32, L2)
        for kg in range(0, I // 32, G):
            wv, sv = _fp4_tile(w, s, n3, g3, w3, ng, gg, kg, I, S_STRIDE)
            acc = _fp4_sum(acc, wv, sv, _x_step(h_row, kg, G, L3))
        out = gl.sum(acc, axis=1)
        weight = gl.load(wt_ptr + r).to(gl.float32)
        term = (out.to(dt).to(gl.float32) * weight).to(dt).to(gl.float32)
    gl.store(p_ptr + r * D + n1, term)
    if FUSED_SUM:
        _ticket_sum(p_ptr, add_ptr, y_ptr, tickets_ptr, t, nb, n1, D, TOPK, ADD, BLOCK_N, LN)


@_jit
def _ticket_sum(p_ptr, add_ptr, y_ptr, tickets_ptr, t, nb, n1, D, TOPK: gl.constexpr, ADD: gl.constexpr,
                BLOCK_N: gl.constexpr, LN: gl.constexpr):
    """The last of (t, nb)'s TOPK programs sums their terms in routing order and stores y (moe._down_sum_store's
    operations); the loads go to L2 (.cg): other SMs wrote them."""
    dt: gl.constexpr = y_ptr.dtype.element_ty
    gl.thread_barrier()  # every thread's term stored before the ticket's release
    ticket = tickets_ptr + t * gl.num_programs(0) + nb
    if gl.atomic_add(ticket, 1, sem="acq_rel", scope="gpu") == TOPK - 1:
        acc_y = gl.zeros([BLOCK_N], gl.float32, LN)
        for jj in gl.static_range(TOPK):
            acc_y += gl.load(p_ptr + (t * TOPK + jj) * D + n1, cache_modifier=".cg")
        if ADD:
            acc_y = acc_y.to(dt).to(gl.float32) + gl.load(add_ptr + t * D + n1).to(gl.float32)
        gl.store(y_ptr + t * D + n1, acc_y.to(dt))
        gl.store(ticket, 0)


def _rows_per_program() -> int:
    return CONFIG["rows_per_thread"] * CONFIG["num_warps"]


def _fits(w: QWeight, x_width: int) -> bool:
    """An FP4 stack [E, N, K] with e8m0 scales whose shape the kernels take unmasked: K (= x's width) a multiple
    of 1,024, N of the program's rows."""
    return (w.fmt == "fp4" and w.scale is not None and w.scale.dtype == torch.float8_e8m0fnu and w.data.dim() == 3
            and w.data.is_contiguous() and w.scale.is_contiguous() and w.row0 == 0 and w.col0 == 0
            and w.shape[1] == x_width and x_width % 1024 == 0 and w.shape[0] % _rows_per_program() == 0
            and w.scale.shape[-1] == x_width // 32)


def _compiled(x: torch.Tensor) -> bool:
    from . import interpreting

    return (CONFIG["on"] and gl is not None and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)
            and x.dim() == 2 and x.is_contiguous() and not interpreting())


def chosen_gate_up(x: torch.Tensor, w1: QWeight, w3: QWeight) -> bool:
    """Whether moe's kernel 1 for routed rows runs here: CONFIG["on"], a CUDA x [T, D] in bf16/fp16, FP4 experts
    of shapes the kernels take (see _fits). It depends on nothing else (never on T): a row's bits are one
    kernel's, whatever the batch."""
    return (_compiled(x) and _fits(w1, x.shape[1]) and _fits(w3, x.shape[1])
            and w1.data.stride() == w3.data.stride() and w1.scale.stride() == w3.scale.stride())


def chosen_down(x: torch.Tensor, h: torch.Tensor, w2: QWeight) -> bool:
    """Whether moe's kernel 2 runs here (as chosen_gate_up, for h [T * k, I] and w2 [E, D, I])."""
    return _compiled(x) and h.is_contiguous() and _fits(w2, h.shape[1]) and w2.shape[0] == x.shape[1]


_fast: dict = {}


def _launch(kernel):
    """kernel's FastLaunch (dsv4.kernels.fast_launch) under DSV4_FAST_LAUNCH, else kernel."""
    from . import FAST_LAUNCH, fast_launch

    if not FAST_LAUNCH:
        return kernel
    f = _fast.get(kernel)
    if f is None:
        f = _fast[kernel] = fast_launch(kernel)
    return f


def _options() -> dict:
    return {"num_warps": CONFIG["num_warps"]}


def gate_up(x: torch.Tensor, ids: torch.Tensor, w1: QWeight, w3: QWeight, first: int, limit: float) -> torch.Tensor:
    """x [T, D], ids [T, k] (global expert ids) -> h [T * k, I]: moe's kernel 1 for the routed rows."""
    T, k = ids.shape
    I = w1.shape[0]
    d1, s1 = w1.data.view(torch.int32), w1.scale.view(torch.uint8)
    d3, s3 = w3.data.view(torch.int32), w3.scale.view(torch.uint8)
    h = torch.empty(T * k, I, dtype=x.dtype, device=x.device)
    block_n = _rows_per_program()
    _launch(_gate_up_gl_kernel)[(I // block_n, T * k)](
        x, d1, s1, d3, s3, ids.contiguous(), h, I, first, d1.shape[0], d1.stride(0), s1.stride(0), float(limit),
        K=x.shape[1], S_STRIDE=s1.shape[-1], TOPK=k, RN=CONFIG["rows_per_thread"], **_options())
    return h


def down(h: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w2: QWeight, first: int,
         add: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
    """moe's kernel 2 into y [T, D]: sum over the local experts of weight * w2 h, in routing order (+ add, rounded
    as moe's). Where no tickets can be had (a capture before any eager launch) the sum is a second launch."""
    from .qgemv import tickets_for

    T, k = ids.shape
    D, I = w2.shape
    block_n = _rows_per_program()
    tickets = tickets_for(T * (D // block_n), h.device)
    d2, s2 = w2.data.view(torch.int32), w2.scale.view(torch.uint8)
    terms = torch.empty(T, k, D, dtype=torch.float32, device=h.device)
    _launch(_down_gl_kernel)[(D // block_n, T, k)](
        h, d2, s2, ids.contiguous(), weights.contiguous(), y if add is None else add.contiguous(), y, terms, tickets,
        D, first, d2.shape[0], d2.stride(0), s2.stride(0), I=I, S_STRIDE=s2.shape[-1], TOPK=k, ADD=add is not None,
        RN=CONFIG["rows_per_thread"], FUSED_SUM=tickets is not None,
        **_options())
    if tickets is None:
        from .moe import _down_sum_kernel

        launcher(_down_sum_kernel, h)[(cdiv(D, 1024), T)](terms, y if add is None else add.contiguous(), y, D, TOPK=k,
                                                         ADD=add is not None, BLOCK=1024)
    return y
