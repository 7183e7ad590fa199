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
- the shared expert's FP8 gate/up runs in kernel 1's launch (after the routed programs), a program taking 8 of
  the step's tokens for its rows: its tile is read and widened once for them (moe's kernels: once a token).

The sums are fp32 in a fixed order (per word the nibbles 0, 4, 1, 5, 2, 6, 3, 7; a group's four words; the
group's scale; the groups of a lane in K order; then the lanes' sums by a fixed butterfly): a pair's bits
depend on its own row only, never on the batch, but they are not moe's bits (another summation order). So
the choice is the process's (CONFIG["on"], DSV4_MOE_GLUON), like the GEMVs' v2 / v3.

On the tensor cores (CONFIG["mma"], by default where the weights allow it: _mma_rows) a program's rows are 16-row
tiles of mma.sync m16n8k16 products: a lane loads one scale group (16 bytes) of two rows, decodes each word's
nibbles into bf16 pairs (fp16 for fp16 x) by the same shifts and masks, multiplies them by the group's scale (exact:
the scales' range is checked once), and the pair's token is column 0 of the products (x's pairs go in unconverted).
No fp32 widening and no fp32 multiply-add a weight: ~3 instructions a weight in the loop against ~4.4.

Gluon compiles for the GPU only (Triton's interpreter does not run it): on CPU the model keeps moe's kernels,
and tests/test_moe_gl.py checks these against moe's on the GPU.
"""

from __future__ import annotations

import torch

from ..formats import QWeight
from . import PDL, cdiv, expert_groups, getenv, gluon_launcher, interpreting
from .gluon_parts import _jit, _arange5, _globaltimer, _mma_out_rows, _pdl_wait, _prefetch_l2, _split4, _stamp

try:
    from triton.experimental.gluon import language as gl
except ImportError:  # no Gluon (an older Triton, or none): moe's kernels run
    gl = None

GPU_CHECKED = True  # session 14 calls 1-5; the tensor-core programs session 16 calls 3-5 (benchmarks/RESULTS.md)
# on: a decode step's routed experts run here (FP4 experts, bf16/fp16 activations), by default since session 14
# (DSV4_MOE_GLUON=0: moe's pair kernels). Under DSV4_PDL=1 (since session 15) they keep its contract (dsv4.kernels'
# doc): launched with launch_pdl, kernel 1's routed programs wait first (their weights depend on the step's ids), its
# shared programs once their first weight tile is in flight (where the caller says x is two launches back, after their
# sums: CONFIG shared_early); the other two wait first. Without DSV4_PDL no griddepcontrol instruction is compiled.
# rows_per_thread (RN) x warps = outputs a program; the K step is 1,024 inputs (32 lanes x 32). Session 14 calls 1-2
# (benchmarks/moe_bench.py, one Flash layer, world 1): 4 rows a thread and 4 warps the fastest of 2 / 4 / 8 rows and
# 4 / 8 warps; loading the next K step's tiles before this one's sums was slower (167 registers: 3 programs an SM)
# and is not kept.
# shared_rows_per_thread, shared_tokens: the shared expert's FP8 rows a thread and tokens a program in the routed
# launch; 1 and 8 kept the launch near the routed programs' registers (sm_90 census: 2 rows or 16 tokens, 158-241;
# session 26 under DSV4_PDL: 8 tokens 131, 4 tokens 128, 2 tokens 96).
# Session 27 call 1 (moe_bench, mini's kernel 1 with the shared expert, the same bits): shared_tokens 8 -> 4 took a
# 16-token step's launch from 312.8 to 279.3 us and a 32-token step's from 609.4 to 552.3 (4 tokens: 128 registers, no
# spills, 4 blocks an SM; the shared weights read 4 or 8 times a step instead of 2 or 4); 4 by default since, 8 with
# DSV4_MOE_GL_SHARED_TOKENS=8. (The register cap, DSV4_MOE_GL_MAXNREG=128, gave the shared programs as much, 281.1 /
# 553.0 us, but slowed the routed programs: a 32-token step's routed gate/up 359.4 -> 420.8 us.)
# shared_tokens_solo: the tokens a shared program takes in a step of one token (a solo decode step): 8 there computes
# 7 masked tokens' products for nothing (session 14 call 2: a layer's kernel 1 at one token 29.0 us with 1 token a
# program, 38.2 with 8). DSV4_MOE_GL_SOLO_SHARED=8 keeps one compiled size for every step.
CONFIG = {"on": getenv("DSV4_MOE_GLUON", "1") == "1", "rows_per_thread": 4, "num_warps": 4,
          "shared_rows_per_thread": 1, "shared_tokens": int(getenv("DSV4_MOE_GL_SHARED_TOKENS", "4")),
          "shared_tokens_solo": int(getenv("DSV4_MOE_GL_SOLO_SHARED", "1")),
          "mma": getenv("DSV4_MOE_MMA", "1") == "1", "mma_tiles": 1, "mma_unroll": 4, "mma_down": True,
          "grouped": getenv("DSV4_MOE_GL_GROUPED", "1") == "1",
          "gate_up_maxnreg": int(getenv("DSV4_MOE_GL_MAXNREG", "0")),
          "solo_gate_up_maxnreg": int(getenv("DSV4_MOE_GL_SOLO_MAXNREG", "0")),
          "solo_down_maxnreg": int(getenv("DSV4_MOE_GL_SOLO_DOWN_MAXNREG", "40")),
          "shared_early": getenv("DSV4_MOE_GL_SHARED_EARLY", "1") == "1",
          "down_early": getenv("DSV4_MOE_GL_DOWN_EARLY", "1") == "1", "stamps": None,
          "down_prefetch": getenv("DSV4_MOE_GL_DOWN_PREFETCH", "0") == "1"}
# The shared programs of kernel 1 at one token were the launch's tail: 512 programs at Flash's widths beside 768
# routed ones, each a serial chain of 8 K steps with 32 bytes a thread in flight (20 KB an SM at 5 blocks, below what
# the copy bandwidth needs at DRAM's latency). Since session 37 (call 1, benchmarks/RESULTS.md) a shared program loads
# the next K step's tiles before this step's sums (twice the bytes in flight; its sums in _fp8_sums: 78 registers a
# thread where the loop before took 96, 86 for 128 at 16 tokens), and with shared_early (on by default;
# DSV4_MOE_GL_SHARED_EARLY=0 turns it off), under DSV4_PDL where the caller says x was written two launches back
# (dsv4.model.moe: the router's linear and its top-k between), the shared programs come first in the grid and make
# their sums before their wait (dsv4.kernels' contract; their stores after it), streaming while the route kernel
# runs. The same operations in the same order: the same bits (tests/test_moe_gl.py on the GPU; the gate's stream).
# mini's solo decode, one process (decode_ab_bench): pipelined 907.1 -> 913.3 (the sums' form) -> 918.1 (the next
# step first) -> 921.6 tok/s (and early), graph 849.6 -> 865.5; kernel 1's advance 166.4 -> 138.9 us a token, the
# route kernel's 18.9 -> 24.2 (the shared programs beside it). Two rows a thread at one token (126-166 registers)
# was not measured.
# down_early (DSV4_MOE_GL_DOWN_EARLY=0 turns it off; on by default since session 41): kernel 2's tensor-core programs
# of a step without groups (a solo step, a one-row batch) make their sums before their wait where the caller says h
# was written two or more launches back (dsv4.model.moe: the shared expert's down linear runs between kernel 1 and
# kernel 2; ids and the routing weights are older still): the pair's expert id, its FP4 tile, its scales, h's row and
# its weight are read while the kernel before (that linear) finishes, and only the term's store, the ticket and the
# sum (which reads the shared output, the kernel before's) come after the wait. The same operations in the same
# order: the same bits. Session 41 call 3 (decode_ab on mini, one process): pipelined 976.7 -> 986.9 tok/s (+1.05 %,
# ahead in every round); the gate's stream unchanged (61800865 / bd96b9e9) under it.
# down_prefetch (DSV4_MOE_GL_DOWN_PREFETCH=1; off until a GPU run: written in session 45, never run): the shared
# expert's down linear (qgemv v2, between kernel 1 and kernel 2) releases kernel 2 first of all (qgemv.linear's
# release, pdl_release) instead of after its wait, and kernel 2 (prefetch: a one-token step's tensor-core programs
# without groups, PREFETCH) reads before its wait only its pair's expert id and issues L2 prefetches of its rows of
# that expert's w2 and their scales; h, the weights and the sums come after the wait (down_early is not taken: h is
# kernel 1's, which may still run). Why: session 45 call 4's chain (benchmarks/chain_leads.py) has kernel 2 start only
# 2.2 us before the shared down linear ends and add 8.7 us after it, where its w2 reads (a cold expert's DRAM round
# trip and its address translation, benchmarks/tlb_probe.py: ~1-2 us past 8 GiB) could run under kernel 1's ~13 us,
# whose ~3 local pairs leave most SMs room at a Flash rank. The same arithmetic in the same order: the same bits.
# Session 45 call 1 (benchmarks/RESULTS.md) measured and removed solo_gate_up_warps (8 warps: a Flash rank +0.8 %,
# mini -0.5 %, and a token alone no longer had its batch bits) and solo_gate_up_splits (K split in 2: a Flash
# rank +0.1 %, mini -1.3 %).
# stamps (None by default; a diagnostic, benchmarks/moe_stamps.py sets it): a dict {"k1": int64 [slots, programs, 4],
# "k2": likewise, "slots": n, "next": {"k1": 0, "k2": 0}}; a one-token step's kernel 1 and (ungrouped) kernel 2 then
# write each program's [start, after its wait (kernel 1's routed programs; else -1), end, kind] (%globaltimer ns) into
# the next slot of their buffer, round robin (slots = the layers: launch i of a step writes slot i). The same sums.
# gate_up_maxnreg (DSV4_MOE_GL_MAXNREG=128; 0, off, by default: not yet run on a GPU): kernel 1's registers a thread
# capped (ptxas maxnreg). Session 26 call 4's ncu of a 16-token step's kernel 1 (grouped): DRAM 48 % of its peak, an
# instruction issued 57 % of the cycles, 3 blocks an SM (18.75 % occupancy) for want of registers: under DSV4_PDL its
# sm_90 build takes 131 registers a thread (benchmarks/sass_census.py --kernel gl_grouped), 3 over the 128 that would
# let 4 blocks (16 warps) share an SM. Capped at 128: 24 bytes of stack, 5 spill stores and loads outside the K loop,
# the loop's 1,514 instructions unchanged. The same operations in the same order: the same bits, so the cap may
# follow the step's size: only steps of more than one token take it (a one-token step's build, its shared programs
# of one token, takes 96 registers, and 128 under the cap: ptxas spends what it is allowed, 4 blocks an SM for 5).
# solo_down_maxnreg (DSV4_MOE_GL_SOLO_DOWN_MAXNREG; 40 by default since session 38, 0 uncapped), solo_gate_up_maxnreg
# (DSV4_MOE_GL_SOLO_MAXNREG; 0, off): the registers a thread of kernel 2 / kernel 1 in a step of one token, capped so
# that the launch is one wave. The same operations in the same order: the same bits (tests/test_moe_gl.py on the GPU).
# At one token kernel 2 is 1,536 programs (D / 16 x 6 pairs) of 54 registers: 9 blocks an SM, 1,188 on 132 SMs, 1.3
# waves (session 33's ncu: 1.3 waves, DRAM 36 %); capped at 40 (sm_90 census: no spill) 12 blocks an SM, 1,584. Its
# tensor-core programs only (the CUDA-core programs, DSV4_MOE_MMA=0, take 92 registers and would spill at 40).
# Session 38 call 2 (benchmarks/RESULTS.md): mini's solo decode pipelined 924.2 -> 928.7 tok/s (+0.5 %, ahead in every
# round, the same stream); kernel 2 at one token 14.2 -> 13.6 us (mini's layer), 9.7 -> 9.1 (a Flash rank's). Kernel
# 1 (78 registers, 6 blocks an SM) capped at 72 / 64 spills (16 / 40 bytes of stack): pipelined -1.1 / -2.5 % (as
# session 33's solo_maxnreg, -1.4 / -4.5 %); the switch stays, off, for the next shape that wants it.
# grouped (on by default since session 26; DSV4_MOE_GL_GROUPED=0 turns it off): in a step of more than one token, the
# tensor-core programs of both kernels take a group of up to 8 pairs of one expert (dsv4.kernels.expert_groups, one
# launch a layer before kernel 1), a pair a column of the m16n8k16 products, so that an expert picked by several of the
# step's tokens is read once for them (mini at concurrency 16: 96 pairs a layer, ~81 experts). The same bits as the
# ungrouped programs (a column's sums read its own column only; tests/test_moe_gl.py holds them equal), so the choice
# may follow the step's size. Session 26 call 2 (benchmarks/RESULTS.md), mini on one H200: moe_bench's routed layer at
# 16 / 32 tokens 423.6 -> 384.3 / 861.3 -> 759.2 us; the server at concurrency 16 / 32 2,523 -> 2,660 / 2,725 -> 2,992
# tok/s (TPOT p50 4.57 -> 4.36 / 8.76 -> 7.73 ms), every request's tokens the same.
# mma (on by default since session 16, call 5; DSV4_MOE_MMA=0 for the CUDA-core programs): the routed programs of
# both kernels on the tensor cores (_mma_rows), where the weights' shapes and scales allow it (_mma_shape,
# _mma_fits; else the CUDA-core programs): fewer instructions a weight (the weights' pairs, times their group's
# scale, go straight into mma.sync: no widening to fp32, no fp32 multiply-add a weight). Another summation order
# than the CUDA-core programs' (within the same tolerances; a row's bits still never depend on the batch). Session
# 16 (benchmarks/RESULTS.md): one Flash layer's kernel 1 with the shared expert 28.6 -> 23.9 us at 1 token, 334 ->
# 310 us at 16; kernel 2 at 16 tokens 186 -> 174 us; mini's pooled 16-row step 5.42 -> 4.85 ms. mma_tiles: 16-row
# tiles a warp (1: 2 fails to compile in Triton 3.6, "error encountered during parsing"); mma_unroll: the 128-input
# chunks whose bytes a warp loads before their products; mma_down: kernel 2 too.


def _pair_ptx(reg: str, src: str, q: int, bf16: bool = False) -> str:
    """PTX placing nibbles q and q + 4 of int32 word src as a pair in reg (registers m and s scratch): magnitude (bits
    4q..4q+2) to fp16 bits 9-11 (e2m1 times 2**-14) or bf16 bits 6-8 (times 2**-126), sign (bit 4q+3) to bit 15; the
    high nibble lands 16 bits up. Exact, the subnormal 0.5 included: two shifts and two masks, no byte permutes."""
    shift, mask = (6 - 4 * q, "0x01C001C0") if bf16 else (9 - 4 * q, "0x0E000E00")
    return (f"{'shl' if shift >= 0 else 'shr'}.b32 m, {src}, {abs(shift)};\nand.b32 m, m, {mask};\n"
            + (f"shl.b32 s, {src}, {12 - 4 * q};\n" if q < 3 else f"mov.b32 s, {src};\n")
            + f"and.b32 s, s, 0x80008000;\nor.b32 {reg}, m, s;\n")


# A word's 8 nibbles as fp32 values (e2m1 times 2**-14), in the order 0, 4, 1, 5, 2, 6, 3, 7: each fp16 pair widened.
_DECODE_PTX = ("{\n.reg .b32 m, s, t;\n.reg .b16 lo, hi;\n"
               + "".join(_pair_ptx("t", "$8", q) + f"mov.b32 {{lo, hi}}, t;\ncvt.f32.f16 ${2 * q}, lo;\n"
                         f"cvt.f32.f16 ${2 * q + 1}, hi;\n" for q in range(4)) + "}")


# One word of each of two rows on the tensor cores: $4 the word of row g, $5 of row g + 8, $6 and $7 their rows'
# multipliers (_multiplier), $8-$11 x's pairs for the word's inputs (_X_PAIRS_*), $12-$15 the accumulator in: the
# words' nibbles as pairs of x's type (_pair_ptx: bf16 for bf16 x, fp16 for fp16 x), times the multipliers (exact:
# _mma_fits), then two m16n8k16 products, nibbles (0, 4) and (1, 5) then (2, 6) and (3, 7): $0-$3 the accumulator
# out, rows (g, g, g + 8, g + 8), columns (2 t, 2 t + 1) (token n: column n).
def _mma_word_ptx(bf16: bool) -> str:
    kind = "bf16" if bf16 else "f16"
    mma = f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32"
    return ("{\n.reg .b32 m, s, a0, a1, a2, a3, a4, a5, a6, a7;\n"
            + "".join(_pair_ptx(f"a{q}", "$4", q, bf16) + f"mul.rn.{kind}x2 a{q}, a{q}, $6;\n"
                      + _pair_ptx(f"a{q + 4}", "$5", q, bf16) + f"mul.rn.{kind}x2 a{q + 4}, a{q + 4}, $7;\n"
                      for q in range(4))
            + f"{mma} {{$0, $1, $2, $3}}, {{a0, a4, a1, a5}}, {{$8, $9}}, {{$12, $13, $14, $15}};\n"
            f"{mma} {{$0, $1, $2, $3}}, {{a2, a6, a3, a7}}, {{$10, $11}}, {{$0, $1, $2, $3}};\n}}")


_MMA_WORD_BF16_PTX = _mma_word_ptx(True)
_MMA_WORD_F16_PTX = _mma_word_ptx(False)
# x[j] (j = 0..7: a word's inputs) as _MMA_WORD's pairs (x[q], x[q + 4]), q = 0..3, from four words of pairs
# (x[2 i], x[2 i + 1]) of x's type: byte permutes, no conversion.
_X_PAIRS_PTX = ("prmt.b32 $0, $4, $6, 0x5410;\nprmt.b32 $1, $4, $6, 0x7632;\n"
                "prmt.b32 $2, $5, $7, 0x5410;\nprmt.b32 $3, $5, $7, 0x7632;")
if gl is not None:
    _DECODE_PTX = gl.constexpr(_DECODE_PTX)
    _MMA_WORD_BF16_PTX = gl.constexpr(_MMA_WORD_BF16_PTX)
    _MMA_WORD_F16_PTX = gl.constexpr(_MMA_WORD_F16_PTX)
    _X_PAIRS_PTX = gl.constexpr(_X_PAIRS_PTX)
_PDL = gl.constexpr(PDL) if gl is not None else PDL  # read at import, as dsv4.kernels reads it
# a group's table row (dsv4.kernels.expert_groups): [expert, count, pairs...], at most _GROUP pairs (8: an MMA's columns)
_GROUP = gl.constexpr(expert_groups.GROUP) if gl is not None else expert_groups.GROUP
_GROUP_ROW = gl.constexpr(expert_groups.GROUP_ROW) if gl is not None else expert_groups.GROUP_ROW


@_jit
def _decode(words):
    """int32 words -> their 8 nibbles' e2m1 values times 2**-14 as fp32, in the order 0, 4, 1, 5, 2, 6, 3, 7."""
    return gl.inline_asm_elementwise(_DECODE_PTX, "=r,=r,=r,=r,=r,=r,=r,=r,r", [words], dtype=(gl.float32,) * 8,
                                     is_pure=True, pack=1)


@_jit
def _tile_index(n1, G: gl.constexpr, L3: gl.constexpr):
    """The tile's indices, broadcastable in its layout: rows n [BLOCK_N, 1, 1] (int64), groups g [1, G, 1], words
    w [1, 1, 4], and for the scales rows [BLOCK_N, 1] (int64) and groups [1, G]."""
    g1 = gl.arange(0, G, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
    w1d = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    return (gl.expand_dims(gl.expand_dims(n1, 1), 2).to(gl.int64), gl.expand_dims(gl.expand_dims(g1, 0), 2),
            gl.expand_dims(gl.expand_dims(w1d, 0), 1), gl.expand_dims(n1, 1).to(gl.int64), gl.expand_dims(g1, 0))


@_jit
def _fp4_tile(w, s, n3, g3, w3, ng, gg, kg, K: gl.constexpr, S_STRIDE: gl.constexpr):
    """A K step's int32 words [BLOCK_N, G, 4] and scales [BLOCK_N, G] (fp32, times 2**14) of rows n of an FP4
    weight, from group kg on (every row inside the weight: _fits holds N a multiple of a program's rows)."""
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
                       RN: gl.constexpr, MMA: gl.constexpr = 0, U: gl.constexpr = 4, GROUPED: gl.constexpr = 0):
    """Grid (I / BLOCK_N, T * TOPK): _routed_program (nb, r), or with MMA (tiles a program) _routed_mma_program, or
    with GROUPED (ids_ptr: dsv4.kernels.expert_groups' table) _routed_mma_group."""
    _pdl_wait()
    _routed(gl.program_id(0), gl.program_id(1).to(gl.int64), x_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, ids_ptr, h_ptr,
            I, first, n_local, w_expert_stride, s_expert_stride, limit, K, S_STRIDE, TOPK, RN, MMA, U, GROUPED)


@_jit
def _routed(nb, r, x_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, ids_ptr, h_ptr, I, first, n_local, w_expert_stride,
            s_expert_stride, limit, K: gl.constexpr, S_STRIDE: gl.constexpr, TOPK: gl.constexpr, RN: gl.constexpr,
            MMA: gl.constexpr, U: gl.constexpr, GROUPED: gl.constexpr):
    if GROUPED:
        _routed_mma_group(nb, r, x_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, ids_ptr, h_ptr, I, first, n_local,
                          w_expert_stride, s_expert_stride, limit, K, S_STRIDE, TOPK, MMA, U)
    elif MMA:
        _routed_mma_program(nb, r, x_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, ids_ptr, h_ptr, I, first, n_local,
                            w_expert_stride, s_expert_stride, limit, K, S_STRIDE, TOPK, MMA, U)
    else:
        _routed_program(nb, r, x_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, ids_ptr, h_ptr, I, first, n_local,
                        w_expert_stride, s_expert_stride, limit, K, S_STRIDE, TOPK, RN)


@_jit(do_not_specialize=["T"])  # one compiled kernel for every step size (Triton compiles an int 1 as a constant)
def _gate_up_shared_gl_kernel(x_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, ids_ptr, h_ptr, sw1_ptr, ss1_ptr, sw3_ptr,
                              ss3_ptr, sh_ptr, T, I, SI, first, n_local, w_expert_stride, s_expert_stride, s_row_skew,
                              limit, K: gl.constexpr, S_STRIDE: gl.constexpr, TOPK: gl.constexpr, RN: gl.constexpr,
                              SS_STRIDE: gl.constexpr, S_RN: gl.constexpr,
                              S_ROWS: gl.constexpr, MMA: gl.constexpr = 0, U: gl.constexpr = 4,
                              GROUPED: gl.constexpr = 0, EARLY: gl.constexpr = 0, st_ptr=None,
                              STAMPS: gl.constexpr = 0):
    """Kernel 1 for the routed rows and the shared expert in one launch (both read only x): a flat grid, the routed
    programs first (_routed_program, row blocks fastest; GROUPED: _routed_mma_group, ids_ptr the groups' table), then
    the shared expert's (_shared_program: a row block of its FP8 gate/up for S_ROWS tokens at a time). EARLY (the
    caller's word that x was written two or more launches back: dsv4.kernels' contract): the shared programs first,
    their sums made before their wait (only their stores after it)."""
    pid = gl.program_id(0)
    blocks = I // (16 * MMA) if MMA else I // (RN * gl.num_warps())
    routed = blocks * T * TOPK
    s_blocks = SI // (S_RN * gl.num_warps())
    if EARLY:  # the shared programs first: they start on x while the kernel before runs
        p = pid - s_blocks * ((T + S_ROWS - 1) // S_ROWS)
        is_routed = p >= 0
        q = pid
    else:
        p = pid
        is_routed = pid < routed
        q = pid - routed
    if STAMPS:  # CONFIG stamps (a one-token step, ungrouped): this program's times, [pid, 4] at st_ptr
        t0 = _globaltimer()
    if is_routed:
        _pdl_wait()
        if STAMPS:
            t1 = _globaltimer()
        _routed(p % blocks, (p // blocks).to(gl.int64), x_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, ids_ptr, h_ptr, I,
                first, n_local, w_expert_stride, s_expert_stride, limit, K, S_STRIDE, TOPK, RN, MMA, U, GROUPED)
        if STAMPS:  # kind 2: a local pair's program, 3: another rank's
            e = gl.load(ids_ptr + p // blocks).to(gl.int64) - first
            _stamp(st_ptr + pid * 4, t0, t1, 3 - ((e >= 0) & (e < n_local)).to(gl.int64))
    else:
        _shared_program(q % s_blocks, q // s_blocks, x_ptr, sw1_ptr, ss1_ptr, sw3_ptr, ss3_ptr, sh_ptr, T, SI,
                        s_row_skew, limit, K, SS_STRIDE, S_RN, S_ROWS, EARLY)
        if STAMPS:  # kind 1: the shared expert's (its wait inside)
            _stamp(st_ptr + pid * 4, t0, t0 * 0 - 1, t0 * 0 + 1)


@_jit
def _shared_program(nb, chunk, x_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, h_ptr, T, SI, row_skew, limit,
                    K: gl.constexpr, S_STRIDE: gl.constexpr, RN: gl.constexpr, ROWS: gl.constexpr,
                    EARLY: gl.constexpr = 0):
    """Outputs nb * BLOCK_N.. of the shared expert's gate and up (FP8 e4m3 [SI, K], 128 x 128 block scales; the
    rank's rows start row_skew into their first scale block) for tokens chunk * ROWS.. (fewer at the end), then the
    activation into h [T, SI]. A thread holds RN rows x 16 consecutive inputs of its lane's 512-input slice; each
    K step's tile is read and widened once for all ROWS tokens, and each token's sums are the operations it gets
    alone (its own products, in the same order): its bits do not depend on the others. Under DSV4_PDL the next K
    step's tiles are loaded before this step's sums (the first step's before the wait); EARLY: the wait after the
    sums, before the stores (x was written two launches back: the caller's word)."""
    G: gl.constexpr = 32
    LF: gl.constexpr = gl.BlockedLayout(size_per_thread=[RN, 1, 16], threads_per_warp=[1, 32, 1],
                                        warps_per_cta=[gl.num_warps(), 1, 1], order=[2, 1, 0])
    L2: gl.constexpr = gl.SliceLayout(2, LF)
    LN: gl.constexpr = gl.SliceLayout(1, L2)
    BLOCK_N: gl.constexpr = RN * gl.num_warps()
    n1 = nb * BLOCK_N + gl.arange(0, BLOCK_N, layout=LN)
    g1 = gl.arange(0, G, layout=gl.SliceLayout(0, L2))
    j1 = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, LF)))
    n3 = gl.expand_dims(gl.expand_dims(n1, 1), 2).to(gl.int64)
    k3 = gl.expand_dims(gl.expand_dims(g1, 0), 2) * 16 + gl.expand_dims(gl.expand_dims(j1, 0), 1)  # [1, G, 16]
    s_rows = gl.expand_dims(((n1 + row_skew) // 128).to(gl.int64), 1) * S_STRIDE  # [BLOCK_N, 1]
    g2 = gl.expand_dims(g1, 0)
    t0 = chunk * ROWS
    acc_g = ()
    acc_u = ()
    for i in gl.static_range(ROWS):
        acc_g = acc_g + (gl.zeros([BLOCK_N, G], gl.float32, L2),)
        acc_u = acc_u + (gl.zeros([BLOCK_N, G], gl.float32, L2),)
    if _PDL:  # the first K step's tile (stored weights) in flight while the kernel waits for the one before
        step = _fp8_step(w1_ptr, s1_ptr, w3_ptr, s3_ptr, n3, k3, s_rows, g2, 0, K)
        if not EARLY:
            _pdl_wait()
        for k0 in range(0, K - 512, 512):
            ahead = _fp8_step(w1_ptr, s1_ptr, w3_ptr, s3_ptr, n3, k3, s_rows, g2, k0 + 512, K)
            acc_g, acc_u = _fp8_sums(acc_g, acc_u, _fp8_widened(step), x_ptr, t0, T, k0, k3, K, ROWS)
            step = ahead
        acc_g, acc_u = _fp8_sums(acc_g, acc_u, _fp8_widened(step), x_ptr, t0, T, K - 512, k3, K, ROWS)
        if EARLY:
            _pdl_wait()
    else:  # without DSV4_PDL one K step's tiles at a time (the same sums)
        for k0 in range(0, K, 512):
            wg = gl.load(w1_ptr + n3 * K + k0 + k3).to(gl.float32)
            wu = gl.load(w3_ptr + n3 * K + k0 + k3).to(gl.float32)
            blk = (k0 + g2 * 16) // 128
            sg = (gl.load(s1_ptr + s_rows + blk).to(gl.int32) << 23).to(gl.float32, bitcast=True)
            su = (gl.load(s3_ptr + s_rows + blk).to(gl.int32) << 23).to(gl.float32, bitcast=True)
            acc_g, acc_u = _fp8_sums(acc_g, acc_u, (wg, wu, sg, su), x_ptr, t0, T, k0, k3, K, ROWS)
    dt: gl.constexpr = h_ptr.dtype.element_ty
    for i in gl.static_range(ROWS):
        t = t0 + i
        gate = gl.minimum(gl.sum(acc_g[i], axis=1).to(dt).to(gl.float32), limit)
        up = gl.minimum(gl.maximum(gl.sum(acc_u[i], axis=1).to(dt).to(gl.float32), -limit), limit)
        act = (gate / (1.0 + gl.exp(-gate))).to(dt).to(gl.float32)
        gl.store(h_ptr + t.to(gl.int64) * SI + n1, (act * up).to(dt), mask=(n1 >= 0) & (t < T))


@_jit
def _fp8_widened(step):
    """A K step's e4m3 tiles and e8m0 scale bytes (_fp8_step) as fp32: (gate, up, gate's scales, up's)."""
    wq, uq, sq, tq = step
    return (wq.to(gl.float32), uq.to(gl.float32), (sq.to(gl.int32) << 23).to(gl.float32, bitcast=True),
            (tq.to(gl.int32) << 23).to(gl.float32, bitcast=True))


@_jit
def _fp8_sums(acc_g, acc_u, widened, x_ptr, t0, T, k0, k3, K: gl.constexpr, ROWS: gl.constexpr):
    """Each of the ROWS tokens' gate and up sums plus this K step's products (widened: _fp8_widened's), the token's
    16 inputs of a thread summed first, then times the group's scale."""
    wg, wu, sg, su = widened
    new_g = ()
    new_u = ()
    for i in gl.static_range(ROWS):
        t = t0 + i
        xv = gl.load(x_ptr + t.to(gl.int64) * K + k0 + k3, mask=(k3 >= 0) & (t < T), other=0.0).to(gl.float32)
        new_g = new_g + (acc_g[i] + gl.sum(wg * xv, axis=2) * sg,)
        new_u = new_u + (acc_u[i] + gl.sum(wu * xv, axis=2) * su,)
    return new_g, new_u


@_jit
def _fp8_step(w1_ptr, s1_ptr, w3_ptr, s3_ptr, n3, k3, s_rows, g2, k0, K: gl.constexpr):
    """A K step of the shared expert's gate and up as stored: e4m3 tiles [BLOCK_N, G, 16] and their block scales'
    bytes [BLOCK_N, G]."""
    blk = (k0 + g2 * 16) // 128
    return (gl.load(w1_ptr + n3 * K + k0 + k3), gl.load(w3_ptr + n3 * K + k0 + k3), gl.load(s1_ptr + s_rows + blk),
            gl.load(s3_ptr + s_rows + blk))


@_jit
def _routed_program(nb, r, x_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, ids_ptr, h_ptr, I, first, n_local, w_expert_stride,
                    s_expert_stride, limit, K: gl.constexpr, S_STRIDE: gl.constexpr, TOPK: gl.constexpr,
                    RN: gl.constexpr):
    """Program (nb, r): the gate and up sums of outputs nb * BLOCK_N.. of pair r (token r // TOPK, local expert
    ids[r] - first; another rank's expert: nothing), then moe's activation into h [T * TOPK, I]."""
    G: gl.constexpr = 32
    L3: gl.constexpr = gl.BlockedLayout(size_per_thread=[RN, 1, 4], threads_per_warp=[1, 32, 1],
                                        warps_per_cta=[gl.num_warps(), 1, 1], order=[2, 1, 0])  # see the docstring
    BLOCK_N: gl.constexpr = RN * gl.num_warps()
    e = gl.load(ids_ptr + r).to(gl.int64) - first
    if (e >= 0) & (e < n_local):
        L2: gl.constexpr = gl.SliceLayout(2, L3)
        n1 = nb * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))
        n3, g3, w3, ng, gg = _tile_index(n1, G, L3)
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
def _multiplier(s_ptr, F16: gl.constexpr):
    """A group's e8m0 scale byte e as the pair of x's type 2**(e - 127) / the decode's factor, twice: bf16
    2**(e - 1) (exponent field e + 126), fp16 2**(e - 113) (field e - 98); in range by _mma_fits."""
    e = gl.load(s_ptr).to(gl.int32)
    return (e - 98) * 0x04000400 if F16 else (e + 126) * 0x00800080


@_jit
def _x_pairs(x0, x1, x2, x3):
    return gl.inline_asm_elementwise(_X_PAIRS_PTX, "=r,=r,=r,=r,r,r,r,r", [x0, x1, x2, x3], dtype=(gl.int32,) * 4,
                                     is_pure=True, pack=1)


@_jit
def _mma_word(wg, wh, mg, mh, b, c, F16: gl.constexpr):
    args = [wg, wh, mg, mh, b[0], b[1], b[2], b[3], c[0], c[1], c[2], c[3]]
    if F16:
        return gl.inline_asm_elementwise(_MMA_WORD_F16_PTX, "=f,=f,=f,=f,r,r,r,r,r,r,r,r,f,f,f,f", args,
                                         dtype=(gl.float32,) * 4, is_pure=True, pack=1)
    else:
        return gl.inline_asm_elementwise(_MMA_WORD_BF16_PTX, "=f,=f,=f,=f,r,r,r,r,r,r,r,r,f,f,f,f", args,
                                         dtype=(gl.float32,) * 4, is_pure=True, pack=1)


@_jit
def _mma_rows(wa_ptr, sa_ptr, wb_ptr, sb_ptr, x_ptr, e, r, nb, w_expert_stride, s_expert_stride, K: gl.constexpr,
              S_STRIDE: gl.constexpr, RT: gl.constexpr, U: gl.constexpr, PAIR: gl.constexpr, GROUPED: gl.constexpr,
              group_row, cols, XDIV: gl.constexpr):
    """The sums of rows nb * 16 RT.. of expert e's FP4 weight a (and, with PAIR, of b: gate and up read one x) with
    row r of x [*, K], on the tensor cores: RT tiles of 16 rows a warp, the K axis split over the warps (chunks of 128
    inputs, 64 bytes a row: warp w takes chunks w, w + W, ..., U of them a step), summed over the warps at the end.
    Lane 4 g + t of a tile loads group t of a chunk of rows g and g + 8 (16 bytes each), the group's scale as a
    multiplier of its weights' pairs, and x's 32 inputs of that group (lanes g = 0: x's row is column 0 of the
    products, the other columns zero); each word is two m16n8k16 products (_MMA_WORD_*) into an fp32 accumulator.
    A row's sum is its own products in an order fixed by the shapes (never by the batch). Returns the sums [RT, 8, 4]
    (tile, g, t; column 0 in lanes t = 0) of rows g and g + 8 for a, then for b (a's again without PAIR).

    GROUPED (dsv4.kernels.expert_groups): columns 0..cols-1 are the pairs of the group whose table row is group_row,
    column j x's row (pair j) // XDIV (lanes g = j load it); returns the four accumulators (rows g, g, g + 8, g + 8;
    columns 2 t, 2 t + 1, 2 t, 2 t + 1) summed over the warps, for a, then for b. Column j's sums are those of its pair
    alone in column 0: an MMA's column reads its own column of x only, and the warps' sum is the same reduction."""
    W: gl.constexpr = gl.num_warps()
    L5: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, RT, 1, 1, 4], threads_per_warp=[1, 1, 8, 4, 1],
                                        warps_per_cta=[W, 1, 1, 1, 1], order=[4, 3, 2, 1, 0])
    L4: gl.constexpr = gl.SliceLayout(4, L5)
    F16: gl.constexpr = x_ptr.dtype.element_ty == gl.float16
    kw = _arange5(W, 0, L5)
    g = _arange5(8, 2, L5)
    t = _arange5(4, 3, L5)
    i = _arange5(4, 4, L5)
    m0 = (nb * (16 * RT) + _arange5(RT, 1, L5) * 16 + g).to(gl.int64)  # [1, RT, 8, 1, 1]
    w0 = e * w_expert_stride + m0 * (K // 8) + t * 4 + i  # the 4 words of group t of chunk 0, row m0
    sc0 = e * s_expert_stride + m0 * S_STRIDE + t  # its scale
    if GROUPED:
        live = g < cols  # column g: the group's pair g
        member = gl.load(group_row + 2 + g, mask=live, other=0).to(gl.int64)
        x0 = (member // XDIV) * (K // 2) + t * 16 + i
        x_live = live & (kw >= 0) & (i >= 0)
    else:
        x0 = r * (K // 2) + t * 16 + i  # x's words (pairs) of group t of chunk 0, 4 at a time
        x_live = (g == 0) & (kw >= 0) & (i >= 0)  # column 0 only: x's row
    x_words = x_ptr.to(gl.pointer_type(gl.int32), bitcast=True)
    zero = gl.zeros([W, RT, 8, 4], gl.float32, L4)
    acc_a = (zero, zero, zero, zero)
    acc_b = (zero, zero, zero, zero)
    for c0 in range(0, K // 128, W * U):
        loads = ()
        for j in gl.static_range(U):
            c = c0 + j * W + kw  # this warp's chunk [W, 1, 1, 1, 1]
            at = w0 + c * 16
            xs = x0 + c * 64
            scs = sc0 + c * 4
            step = (gl.load(wa_ptr + at), gl.load(wa_ptr + at + 8 * (K // 8)),
                    _multiplier(sa_ptr + scs, F16), _multiplier(sa_ptr + scs + 8 * S_STRIDE, F16),
                    gl.load(x_words + xs, mask=x_live, other=0), gl.load(x_words + xs + 4, mask=x_live, other=0),
                    gl.load(x_words + xs + 8, mask=x_live, other=0), gl.load(x_words + xs + 12, mask=x_live, other=0))
            if PAIR:
                step = step + (gl.load(wb_ptr + at), gl.load(wb_ptr + at + 8 * (K // 8)),
                               _multiplier(sb_ptr + scs, F16), _multiplier(sb_ptr + scs + 8 * S_STRIDE, F16))
            loads = loads + (step,)
        for j in gl.static_range(U):
            step = loads[j]
            wa0 = _split4(step[0], L4)
            wa1 = _split4(step[1], L4)
            ma0 = gl.convert_layout(gl.sum(step[2], axis=4), L4)  # [.., 1] -> [..]: the same value
            ma1 = gl.convert_layout(gl.sum(step[3], axis=4), L4)
            xw = (_split4(step[4], L4), _split4(step[5], L4), _split4(step[6], L4), _split4(step[7], L4))
            if PAIR:
                wb0 = _split4(step[8], L4)
                wb1 = _split4(step[9], L4)
                mb0 = gl.convert_layout(gl.sum(step[10], axis=4), L4)
                mb1 = gl.convert_layout(gl.sum(step[11], axis=4), L4)
            for q in gl.static_range(4):  # the group's 4 words
                b = _x_pairs(xw[q][0], xw[q][1], xw[q][2], xw[q][3])
                acc_a = _mma_word(wa0[q], wa1[q], ma0, ma1, b, acc_a, F16)
                if PAIR:
                    acc_b = _mma_word(wb0[q], wb1[q], mb0, mb1, b, acc_b, F16)
    if GROUPED:
        sums_a = (gl.sum(acc_a[0], axis=0), gl.sum(acc_a[1], axis=0), gl.sum(acc_a[2], axis=0),
                  gl.sum(acc_a[3], axis=0))
        if PAIR:
            return sums_a + (gl.sum(acc_b[0], axis=0), gl.sum(acc_b[1], axis=0), gl.sum(acc_b[2], axis=0),
                             gl.sum(acc_b[3], axis=0))
        else:
            return sums_a + sums_a
    elif PAIR:
        return (gl.sum(acc_a[0], axis=0), gl.sum(acc_a[2], axis=0), gl.sum(acc_b[0], axis=0),
                gl.sum(acc_b[2], axis=0))
    else:
        sum_g = gl.sum(acc_a[0], axis=0)
        sum_h = gl.sum(acc_a[2], axis=0)
        return (sum_g, sum_h, sum_g, sum_h)


@_jit
def _routed_mma_program(nb, r, x_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, ids_ptr, h_ptr, I, first, n_local,
                        w_expert_stride, s_expert_stride, limit, K: gl.constexpr, S_STRIDE: gl.constexpr,
                        TOPK: gl.constexpr, RT: gl.constexpr, U: gl.constexpr):
    """Program (nb, r) as _routed_program's, its gate and up sums on the tensor cores (_mma_rows: outputs
    nb * 16 RT..), then moe's activation from lanes t = 0 (column 0)."""
    e = gl.load(ids_ptr + r).to(gl.int64) - first
    if (e >= 0) & (e < n_local):
        sums = _mma_rows(w1_ptr, s1_ptr, w3_ptr, s3_ptr, x_ptr, e, r // TOPK, nb, w_expert_stride, s_expert_stride,
                         K, S_STRIDE, RT, U, True, False, ids_ptr, 1, 1)
        row, t3 = _mma_out_rows(nb, RT)
        for h in gl.static_range(2):  # rows g, then g + 8
            _swiglu_store(h_ptr + r * I + row + 8 * h, sums[h], sums[2 + h], limit, t3 == 0)  # column 0: lanes t = 0


@_jit
def _swiglu_store(at, gate, up, limit, live):
    """moe's activation of gate's and up's fp32 sums (each rounded to h's dtype, clamped by the SwiGLU limit) stored
    at `at` where live."""
    dt: gl.constexpr = at.dtype.element_ty
    gate = gl.minimum(gate.to(dt).to(gl.float32), limit)
    up = gl.minimum(gl.maximum(up.to(dt).to(gl.float32), -limit), limit)
    act = (gate / (1.0 + gl.exp(-gate))).to(dt).to(gl.float32)
    gl.store(at, (act * up).to(dt), mask=live)


@_jit
def _routed_mma_group(nb, p, x_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, groups_ptr, h_ptr, I, first, n_local,
                      w_expert_stride, s_expert_stride, limit, K: gl.constexpr, S_STRIDE: gl.constexpr,
                      TOPK: gl.constexpr, RT: gl.constexpr, U: gl.constexpr):
    """Program (nb, p) of the grouped kernel 1: where table row p leads a group (dsv4.kernels.expert_groups), the gate
    and up sums of outputs nb * 16 RT.. of its expert for its pairs, one a column (_mma_rows GROUPED: the expert's
    tiles read once for them all), then moe's activation of each into its row of h, as _routed_mma_program's."""
    group_row = groups_ptr + p * _GROUP_ROW
    cols = gl.load(group_row + 1)
    e = gl.load(group_row).to(gl.int64) - first
    if (cols > 0) & (e >= 0) & (e < n_local):
        sums = _mma_rows(w1_ptr, s1_ptr, w3_ptr, s3_ptr, x_ptr, e, 0, nb, w_expert_stride, s_expert_stride, K,
                         S_STRIDE, RT, U, True, True, group_row, cols, TOPK)
        row, t3 = _mma_out_rows(nb, RT)
        for hh in gl.static_range(2):  # rows g, then g + 8
            for cc in gl.static_range(2):  # columns 2 t, then 2 t + 1
                col = 2 * t3 + cc
                live = col < cols
                member = gl.load(group_row + 2 + col, mask=live, other=0).to(gl.int64)
                _swiglu_store(h_ptr + member * I + row + 8 * hh, sums[2 * hh + cc], sums[4 + 2 * hh + cc], limit,
                              live & (row >= 0))


@_jit
def _down_gl_kernel(h_ptr, w_ptr, s_ptr, ids_ptr, wt_ptr, add_ptr, y_ptr, p_ptr, tickets_ptr, D, first, n_local,
                 w_expert_stride, s_expert_stride, I: gl.constexpr, S_STRIDE: gl.constexpr, TOPK: gl.constexpr,
                 ADD: gl.constexpr, RN: gl.constexpr, FUSED_SUM: gl.constexpr, MMA: gl.constexpr = 0,
                 U: gl.constexpr = 4, GROUPED: gl.constexpr = 0, EARLY: gl.constexpr = 0, st_ptr=None,
                 STAMPS: gl.constexpr = 0, PREFETCH: gl.constexpr = 0):
    """Grid (D / BLOCK_N, T, TOPK): program (nb, t, j) stores pair t * TOPK + j's term, its down projection rounded
    times its routing weight rounded (0 for another rank's expert), into p [T, TOPK, D] (fp32); the last of a
    (t, nb)'s TOPK programs (an int32 ticket) sums the terms in routing order, then moe's store (with ADD, the
    sum rounded plus add[t], rounded again). moe._down_split_kernel's arithmetic, this module's tile. Without
    FUSED_SUM no tickets: the caller sums the terms in a second launch (moe._down_sum_kernel: the same operations,
    bits). With MMA (16-row tiles a program) the down projection's sums run on the tensor cores (_mma_rows). GROUPED
    (with MMA): grid (D / BLOCK_N, T * TOPK), ids_ptr the groups' table (_down_mma_group). EARLY (with MMA, without
    GROUPED: the caller's word that h was written two or more launches back, CONFIG down_early): the sums before the
    wait, the stores after it. PREFETCH (with MMA, without GROUPED and EARLY: CONFIG down_prefetch, the kernel before
    released this one first of all, so only the ids are old enough): the program's rows of its pair's w2 and their
    scales prefetched into L2 before the wait (_prefetch_down), everything else after it."""
    if STAMPS:  # CONFIG stamps (a one-token step): [program, 4] at st_ptr, programs in grid order (nb fastest)
        t0 = _globaltimer()
    if PREFETCH:
        _prefetch_down(w_ptr, s_ptr, ids_ptr, first, n_local, w_expert_stride, s_expert_stride, I, S_STRIDE, TOPK,
                       MMA)
    if not EARLY:
        _pdl_wait()
    if GROUPED:
        _down_mma_group(h_ptr, w_ptr, s_ptr, ids_ptr, wt_ptr, add_ptr, y_ptr, p_ptr, tickets_ptr, D, first, n_local,
                        w_expert_stride, s_expert_stride, I, S_STRIDE, TOPK, ADD, FUSED_SUM, MMA, U)
    elif MMA:
        _down_mma_program(h_ptr, w_ptr, s_ptr, ids_ptr, wt_ptr, add_ptr, y_ptr, p_ptr, tickets_ptr, D, first,
                          n_local, w_expert_stride, s_expert_stride, I, S_STRIDE, TOPK, ADD, FUSED_SUM, MMA, U, EARLY)
    else:
        _down_cuda_cores(h_ptr, w_ptr, s_ptr, ids_ptr, wt_ptr, add_ptr, y_ptr, p_ptr, tickets_ptr, D, first, n_local,
                         w_expert_stride, s_expert_stride, I, S_STRIDE, TOPK, ADD, RN, FUSED_SUM)
    if STAMPS:  # kind 2: a local pair's program, 3: another rank's
        pid = gl.program_id(0) + gl.num_programs(0) * (gl.program_id(1) + gl.num_programs(1) * gl.program_id(2))
        e = gl.load(ids_ptr + gl.program_id(1).to(gl.int64) * TOPK + gl.program_id(2)).to(gl.int64) - first
        _stamp(st_ptr + pid.to(gl.int64) * 4, t0, t0 * 0 - 1, 3 - ((e >= 0) & (e < n_local)).to(gl.int64))


@_jit
def _prefetch_down(w_ptr, s_ptr, ids_ptr, first, n_local, w_expert_stride, s_expert_stride, I: gl.constexpr,
                   S_STRIDE: gl.constexpr, TOPK: gl.constexpr, RT: gl.constexpr):
    """Program (nb, t, j)'s rows nb * 16 RT.. of its pair's expert's w2 (int32 words, I / 8 a row: I / 256 lines of
    128 bytes) and their scales (a row's S_STRIDE bytes) into L2, one line a thread (a local pair only)."""
    ROWS: gl.constexpr = 16 * RT
    LINES: gl.constexpr = I // 256
    L1: gl.constexpr = gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32], warps_per_cta=[gl.num_warps()],
                                        order=[0])
    e = gl.load(ids_ptr + gl.program_id(1).to(gl.int64) * TOPK + gl.program_id(2)).to(gl.int64) - first
    if (e >= 0) & (e < n_local):
        i = gl.arange(0, ROWS * LINES, layout=L1)
        row = (gl.program_id(0) * ROWS + i // LINES).to(gl.int64)
        _prefetch_l2(w_ptr + e * w_expert_stride + row * (I // 8) + (i % LINES) * 32)
        scale_row = (gl.program_id(0) * ROWS + i % ROWS).to(gl.int64)
        _prefetch_l2(s_ptr + e * s_expert_stride + scale_row * S_STRIDE)


@_jit
def _down_cuda_cores(h_ptr, w_ptr, s_ptr, ids_ptr, wt_ptr, add_ptr, y_ptr, p_ptr, tickets_ptr, D, first, n_local,
                     w_expert_stride, s_expert_stride, I: gl.constexpr, S_STRIDE: gl.constexpr, TOPK: gl.constexpr,
                     ADD: gl.constexpr, RN: gl.constexpr, FUSED_SUM: gl.constexpr):
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
        n3, g3, w3, ng, gg = _tile_index(n1, G, L3)
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
def _down_mma_program(h_ptr, w_ptr, s_ptr, ids_ptr, wt_ptr, add_ptr, y_ptr, p_ptr, tickets_ptr, D, first, n_local,
                      w_expert_stride, s_expert_stride, I: gl.constexpr, S_STRIDE: gl.constexpr, TOPK: gl.constexpr,
                      ADD: gl.constexpr, FUSED_SUM: gl.constexpr, RT: gl.constexpr, U: gl.constexpr,
                      EARLY: gl.constexpr = 0):
    """_down_gl_kernel's program (nb, t, j), the term's sums on the tensor cores (_mma_rows, rows nb * 16 RT..):
    the same rounding of the term and the same ticketed sum. EARLY: everything up to the term's store before the
    wait (h, the ids and the weights two or more launches old: the caller's word)."""
    nb = gl.program_id(0)
    t = gl.program_id(1).to(gl.int64)
    j = gl.program_id(2)
    r = t * TOPK + j
    dt: gl.constexpr = y_ptr.dtype.element_ty
    row, t3 = _mma_out_rows(nb, RT)
    e = gl.load(ids_ptr + r).to(gl.int64) - first
    if (e >= 0) & (e < n_local):
        sums = _mma_rows(w_ptr, s_ptr, w_ptr, s_ptr, h_ptr, e, r, nb, w_expert_stride, s_expert_stride, I, S_STRIDE,
                         RT, U, False, False, ids_ptr, 1, 1)
        weight = gl.load(wt_ptr + r).to(gl.float32)
        terms = ((sums[0].to(dt).to(gl.float32) * weight).to(dt).to(gl.float32),
                 (sums[1].to(dt).to(gl.float32) * weight).to(dt).to(gl.float32))
        if EARLY:
            _pdl_wait()
        for h in gl.static_range(2):  # rows g, then g + 8
            gl.store(p_ptr + r * D + row + 8 * h, terms[h], mask=t3 == 0)
    else:
        if EARLY:
            _pdl_wait()
        for h in gl.static_range(2):  # another rank's expert: a zero term
            gl.store(p_ptr + r * D + row + 8 * h, (row * 0).to(gl.float32), mask=t3 == 0)
    if FUSED_SUM:
        LN: gl.constexpr = gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32], warps_per_cta=[gl.num_warps()],
                                            order=[0])
        n1 = nb * (16 * RT) + gl.arange(0, 16 * RT, layout=LN)
        _ticket_sum(p_ptr, add_ptr, y_ptr, tickets_ptr, t, nb, n1, D, TOPK, ADD, 16 * RT, LN)


@_jit
def _down_mma_group(h_ptr, w_ptr, s_ptr, groups_ptr, wt_ptr, add_ptr, y_ptr, p_ptr, tickets_ptr, D, first, n_local,
                    w_expert_stride, s_expert_stride, I: gl.constexpr, S_STRIDE: gl.constexpr, TOPK: gl.constexpr,
                    ADD: gl.constexpr, FUSED_SUM: gl.constexpr, RT: gl.constexpr, U: gl.constexpr):
    """Program (nb, p) of the grouped kernel 2: where table row p leads a group, each of its pairs' terms (a column
    each, _mma_rows GROUPED on h's rows) rounded and stored as _down_mma_program's (zeros for another rank's
    expert); then, for each pair in turn, its token's ticket (the terms of the token's TOPK pairs summed in routing
    order by whichever program comes last, as ungrouped)."""
    nb = gl.program_id(0)
    p = gl.program_id(1).to(gl.int64)
    group_row = groups_ptr + p * _GROUP_ROW
    cols = gl.load(group_row + 1)
    if cols > 0:
        dt: gl.constexpr = y_ptr.dtype.element_ty
        row, t3 = _mma_out_rows(nb, RT)
        e = gl.load(group_row).to(gl.int64) - first
        if (e >= 0) & (e < n_local):
            sums = _mma_rows(w_ptr, s_ptr, w_ptr, s_ptr, h_ptr, e, 0, nb, w_expert_stride, s_expert_stride, I,
                             S_STRIDE, RT, U, False, True, group_row, cols, 1)
            for hh in gl.static_range(2):  # rows g, then g + 8
                for cc in gl.static_range(2):  # columns 2 t, then 2 t + 1
                    col = 2 * t3 + cc
                    live = col < cols
                    member = gl.load(group_row + 2 + col, mask=live, other=0).to(gl.int64)
                    weight = gl.load(wt_ptr + member, mask=live, other=0.0).to(gl.float32)
                    term = (sums[2 * hh + cc].to(dt).to(gl.float32) * weight).to(dt).to(gl.float32)
                    gl.store(p_ptr + member * D + row + 8 * hh, term, mask=live & (row >= 0))
        else:  # another rank's expert: zero terms
            for hh in gl.static_range(2):
                for cc in gl.static_range(2):
                    col = 2 * t3 + cc
                    live = col < cols
                    member = gl.load(group_row + 2 + col, mask=live, other=0).to(gl.int64)
                    gl.store(p_ptr + member * D + row + 8 * hh, (row * 0).to(gl.float32), mask=live & (row >= 0))
        if FUSED_SUM:
            LN: gl.constexpr = gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32],
                                                warps_per_cta=[gl.num_warps()], order=[0])
            n1 = nb * (16 * RT) + gl.arange(0, 16 * RT, layout=LN)
            for j in gl.static_range(_GROUP):
                if j < cols:
                    t = gl.load(group_row + 2 + j).to(gl.int64) // TOPK
                    _ticket_sum(p_ptr, add_ptr, y_ptr, tickets_ptr, t, nb, n1, D, TOPK, ADD, 16 * RT, LN)


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


def _mma(x: torch.Tensor, *ws: QWeight) -> dict:
    """A kernel's tensor-core constants (MMA: 16-row tiles a program, U) where CONFIG["mma"] is on and its FP4
    weights ws take them (_mma_shape, _mma_fits); {} (the CUDA-core programs) otherwise. It depends on the weights
    and x's type only, never on the batch."""
    if not CONFIG["mma"] or not all(_mma_shape(w, w.shape[1]) and _mma_fits(w, x.dtype) for w in ws):
        return {}
    return {"MMA": CONFIG["mma_tiles"], "U": CONFIG["mma_unroll"]}


def _block_n(mma: dict) -> int:
    """Outputs a program of kernel 1's routed rows or kernel 2 computes."""
    return 16 * mma["MMA"] if mma else _rows_per_program()


def _fits(w: QWeight, x_width: int) -> bool:
    """An FP4 stack [E, N, K] with e8m0 scales whose shape the kernels take unmasked: K (= x's width) a multiple
    of 1,024, N of the program's rows."""
    return (w.fmt == "fp4" and w.scale is not None and w.scale.dtype == torch.float8_e8m0fnu and w.data.dim() == 3
            and w.data.is_contiguous() and w.scale.is_contiguous() and w.row0 == 0 and w.col0 == 0
            and w.shape[1] == x_width and x_width % 1024 == 0 and w.shape[0] % _rows_per_program() == 0
            and w.scale.shape[-1] == x_width // 32)


def _mma_shape(w: QWeight, x_width: int) -> bool:
    """An FP4 stack [E, N, K] in the tensor-core programs: 16-row tiles, whole 128-input chunks for every warp's
    steps."""
    return (w.shape[0] % (16 * CONFIG["mma_tiles"]) == 0
            and x_width % (128 * CONFIG["num_warps"] * CONFIG["mma_unroll"]) == 0)


def _compiled(x: torch.Tensor) -> bool:
    return (CONFIG["on"] and gl is not None and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)
            and x.dim() == 2 and x.is_contiguous() and not interpreting())


def _mma_fits(w: QWeight, dtype: torch.dtype) -> bool:
    """Whether every e8m0 scale byte e of w lets _MMA_WORD's products be exact: an e2m1 value times 2**(e - 127)
    exact in x's type and the multiplier a normal number of it: bf16 e <= 128; fp16 e in [104, 128] (the smallest
    value, 0.5, >= 2**-24; the largest, 6, <= 65504). The scales' range is read once (a host read, kept on the scale
    tensor): the first step that asks must not be a graph capture (a capture's warm-up steps run eagerly first)."""
    scales = w.scale
    span = getattr(scales, "_dsv4_mma_span", None)
    if span is None:
        if scales.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("moe_gl mma: the expert scales' range check (a host read) would run inside a graph "
                               "capture; run one eager step first")
        e = scales.view(torch.uint8)
        span = scales._dsv4_mma_span = (int(e.min()), int(e.max()))
    low, high = span
    return high <= 128 and (dtype == torch.bfloat16 or low >= 104)


def chosen_gate_up(x: torch.Tensor, w1: QWeight, w3: QWeight) -> bool:
    """Whether moe's kernel 1 for routed rows runs here: CONFIG["on"], a CUDA x [T, D] in bf16/fp16, FP4 experts
    of shapes the kernels take (see _fits). It depends on nothing else (never on T): a row's bits are one kernel's,
    whatever the batch."""
    return (_compiled(x) and _fits(w1, x.shape[1]) and _fits(w3, x.shape[1])
            and w1.data.stride() == w3.data.stride() and w1.scale.stride() == w3.scale.stride())


def chosen_down(x: torch.Tensor, h: torch.Tensor, w2: QWeight) -> bool:
    """Whether moe's kernel 2 runs here (as chosen_gate_up, for h [T * k, I] and w2 [E, D, I])."""
    return _compiled(x) and h.is_contiguous() and _fits(w2, h.shape[1]) and w2.shape[0] == x.shape[1]


_launch = gluon_launcher  # a module global: tests/compile_kernels.py and sass_census replace it to compile only


def _stamps(kernel: str, programs: int) -> dict:
    """A launch's stamps arguments under CONFIG stamps (its buffer's next slot), else none."""
    st = CONFIG["stamps"]
    if st is None:
        return {}
    buf = st[kernel]
    if buf.shape[1] < programs or buf.shape[2] != 4 or buf.dtype != torch.int64:
        raise ValueError(f"moe_gl stamps[{kernel!r}]: {tuple(buf.shape)} {buf.dtype}, want [slots, >= {programs}, 4] "
                         "int64")
    slot = st["next"][kernel] % st["slots"]
    st["next"][kernel] += 1
    return {"st_ptr": buf[slot], "STAMPS": 1}


def _options() -> dict:
    return {"num_warps": CONFIG["num_warps"]}


def _gate_up_options(T: int) -> dict:
    """Kernel 1's compile options beyond _options for a step of T tokens: CONFIG gate_up_maxnreg's cap where set and
    T > 1, solo_gate_up_maxnreg's where set and T == 1 (see CONFIG)."""
    cap = CONFIG["solo_gate_up_maxnreg"] if T == 1 else CONFIG["gate_up_maxnreg"]
    return {"maxnreg": cap} if cap else {}


def _down_options(T: int, mma: dict) -> dict:
    """Kernel 2's compile options beyond _options for a step of T tokens: CONFIG solo_down_maxnreg's cap where set, T
    == 1 and the programs are the tensor cores' (mma; the CUDA-core programs take 92 registers: 40 would spill)."""
    return {"maxnreg": CONFIG["solo_down_maxnreg"]} if CONFIG["solo_down_maxnreg"] and T == 1 and mma else {}


def groups_for(x: torch.Tensor, ids: torch.Tensor, w1: QWeight, w3: QWeight) -> torch.Tensor | None:
    """The step's pairs grouped by expert (dsv4.kernels.expert_groups' table) where CONFIG grouped is on, the step
    has more than one token and kernel 1 runs here on the tensor cores; else None (the ungrouped programs). Kernel 2
    takes the same table where it runs on the tensor cores too (grouped or not, the same bits)."""
    T, k = ids.shape
    if not (CONFIG["grouped"] and T > 1 and expert_groups.supported(ids) and chosen_gate_up(x, w1, w3)
            and _mma(x, w1, w3)):
        return None
    return expert_groups.groups(ids)


def _ids_or_groups(ids: torch.Tensor, groups: torch.Tensor | None, mma: dict) -> tuple[torch.Tensor, dict]:
    """What a kernel reads at ids_ptr (the groups' table where given and the kernel's programs are the tensor
    cores', else the ids) and its GROUPED constant."""
    if groups is not None and mma:
        return groups, {"GROUPED": 1}
    return ids.contiguous(), {}


def gate_up(x: torch.Tensor, ids: torch.Tensor, w1: QWeight, w3: QWeight, first: int, limit: float,
            groups: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, D], ids [T, k] (global expert ids) -> h [T * k, I]: moe's kernel 1 for the routed rows (groups:
    groups_for's table, or None)."""
    T, k = ids.shape
    I = w1.shape[0]
    d1, s1 = w1.data.view(torch.int32), w1.scale.view(torch.uint8)
    d3, s3 = w3.data.view(torch.int32), w3.scale.view(torch.uint8)
    h = torch.empty(T * k, I, dtype=x.dtype, device=x.device)
    mma = _mma(x, w1, w3)
    at, grouped = _ids_or_groups(ids, groups, mma)
    _launch(_gate_up_gl_kernel)[(I // _block_n(mma), T * k)](
        x, d1, s1, d3, s3, at, h, I, first, d1.shape[0], d1.stride(0), s1.stride(0), float(limit),
        K=x.shape[1], S_STRIDE=s1.shape[-1], TOPK=k, RN=CONFIG["rows_per_thread"], **mma, **grouped,
        **_options(), **_gate_up_options(T))
    return h


def shared_fits(x: torch.Tensor, w1: QWeight, w3: QWeight) -> bool:
    """The shared expert's gate/up ([SI, D] each, this rank's rows) in _gate_up_shared_gl_kernel: FP8 with e8m0
    block scales, D a multiple of 512, SI of the program's rows."""
    def fits(w):
        return (w.fmt == "fp8" and w.scale is not None and w.scale.dtype == torch.float8_e8m0fnu and w.data.dim() == 2
                and w.data.is_contiguous() and w.scale.is_contiguous() and w.col0 == 0 and w.shape[1] == x.shape[1]
                and x.shape[1] % 512 == 0 and w.scale.shape[-1] == x.shape[1] // 128
                and w.shape[0] % (CONFIG["shared_rows_per_thread"] * CONFIG["num_warps"]) == 0)
    return fits(w1) and fits(w3) and w1.shape == w3.shape and w1.row0 == w3.row0


def gate_up_shared(x: torch.Tensor, ids: torch.Tensor, w1: QWeight, w3: QWeight, first: int, sw1: QWeight,
                   sw3: QWeight, limit: float, groups: torch.Tensor | None = None,
                   early: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(h [T * k, I] of the routed rows, h [T, SI] of the shared expert) in one launch (see
    _gate_up_shared_gl_kernel; groups: groups_for's table, or None). early: the caller's word that x was written two
    or more launches back (dsv4.kernels' contract), which CONFIG shared_early takes under DSV4_PDL."""
    T, k = ids.shape
    I, SI = w1.shape[0], sw1.shape[0]
    d1, s1 = w1.data.view(torch.int32), w1.scale.view(torch.uint8)
    d3, s3 = w3.data.view(torch.int32), w3.scale.view(torch.uint8)
    t1, t3 = sw1.scale.view(torch.uint8), sw3.scale.view(torch.uint8)
    h = torch.empty(T * k, I, dtype=x.dtype, device=x.device)
    sh = torch.empty(T, SI, dtype=x.dtype, device=x.device)
    # Tokens a shared program takes: shared_tokens (masked past T), or shared_tokens_solo in a step of one token.
    # A token's sums are the same operations in either size (its own products in its own order, _shared_program);
    # tests/test_moe_gl.py holds each token alone (solo size) equal to it in a batch, bit for bit, on the GPU.
    rows = CONFIG["shared_tokens_solo"] if T == 1 else CONFIG["shared_tokens"]
    s_rn, warps = CONFIG["shared_rows_per_thread"], CONFIG["num_warps"]
    shared = {"EARLY": 1} if early and CONFIG["shared_early"] and PDL else {}
    mma = _mma(x, w1, w3)
    at, grouped = _ids_or_groups(ids, groups, mma)
    programs = I // _block_n(mma) * T * k + SI // (s_rn * warps) * cdiv(T, rows)
    stamps = _stamps("k1", programs) if T == 1 and not grouped else {}
    _launch(_gate_up_shared_gl_kernel)[(programs,)](
        x, d1, s1, d3, s3, at, h, sw1.data, t1, sw3.data, t3, sh, T, I, SI, first, d1.shape[0],
        d1.stride(0), s1.stride(0), sw1.row0 % 128, float(limit), K=x.shape[1], S_STRIDE=s1.shape[-1], TOPK=k,
        RN=CONFIG["rows_per_thread"], SS_STRIDE=t1.shape[-1], S_RN=s_rn, S_ROWS=rows, **mma, **grouped, **shared,
        **stamps, **_options(), **_gate_up_options(T))
    return h, sh


def down(h: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w2: QWeight, first: int,
         add: torch.Tensor | None, y: torch.Tensor, groups: torch.Tensor | None = None,
         early: bool = False, prefetch: bool = False) -> torch.Tensor | None:
    """moe's kernel 2 into y [T, D]: sum over the local experts of weight * w2 h, in routing order (+ add, rounded
    as moe's), summed by the last program of each block: None. Where no tickets can be had (a capture before any
    eager launch) the terms [T, k, D] are returned unsummed, for the caller's second launch (moe._down_sum_kernel:
    the same operations). groups: groups_for's table, or None. early: the caller's word that h was written two or
    more launches back (dsv4.kernels' contract; ids and weights no later), which CONFIG down_early takes under DSV4_PDL
    for the tensor-core programs without groups. prefetch: the caller's word that the kernel before released this one
    first of all (CONFIG down_prefetch: qgemv.linear's release), so that only the ids and the weights are old enough
    to read before the wait: early is then never taken, and the tensor-core programs without groups prefetch their w2
    rows (PREFETCH) where I is whole lines of a power of two."""
    from .qgemv import tickets_for

    T, k = ids.shape
    D, I = w2.shape
    mma = _mma(h, w2) if CONFIG["mma_down"] else {}
    block_n = _block_n(mma)
    tickets = tickets_for(T * (D // block_n), h.device)
    d2, s2 = w2.data.view(torch.int32), w2.scale.view(torch.uint8)
    terms = torch.empty(T, k, D, dtype=torch.float32, device=h.device)
    at, grouped = _ids_or_groups(ids, groups, mma)
    ahead = {"EARLY": 1} if early and not prefetch and CONFIG["down_early"] and PDL and mma and not grouped else {}
    if prefetch and PDL and mma and not grouped and I % 256 == 0 and (I // 256) & (I // 256 - 1) == 0:
        ahead = {"PREFETCH": 1}
    stamps = _stamps("k2", D // block_n * k) if T == 1 and not grouped else {}
    _launch(_down_gl_kernel)[(D // block_n, T * k, 1) if grouped else (D // block_n, T, k)](
        h, d2, s2, at, weights.contiguous(), y if add is None else add.contiguous(), y, terms,
        terms if tickets is None else tickets, D, first, d2.shape[0], d2.stride(0), s2.stride(0), I=I,
        S_STRIDE=s2.shape[-1], TOPK=k, ADD=add is not None, RN=CONFIG["rows_per_thread"],
        FUSED_SUM=tickets is not None, **mma, **grouped, **ahead, **stamps, **_options(), **_down_options(T, mma))
    return terms if tickets is None else None
