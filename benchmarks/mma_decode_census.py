"""Census probe (no GPU): the decode step's FP4 experts on the tensor cores with mma.sync (Gluon's mma_v2), the
weight the A operand decoded straight into its fragment's f16 pairs. Session 14 tried it to see whether it beats
dsv4.kernels.moe_gl's CUDA-core loop (4.4 instructions a weight in the K loop on sm_90).

The layout: an int32 weight word [rows, 4 words of a 32-input group] loaded in the A operand's layout for 32-bit
elements (DotOperandLayout k_width 1: a lane holds word lane % 4 of rows lane / 4 and + 8), its 8 nibbles decoded
to f16 by inline PTX (nibbles q and q + 4 one f16 pair: 2 shifts, 2 masks), joined and permuted so that the f16 A
tile's logical input k' = 16 h + 8 b + 2 c + i is nibble 2 h + b + 4 i of word c (the fragment's own registers: the
conversion to the A layout compiles to no data movement), x gathered in the same permuted order as the B operand
(bf16 -> f16), one mma a 16-input half, the group's ue8m0 scale applied to the fp32 partial.

Found (sass_census's parser on the compiled sm_90 kernel; R m16 tiles a warp, the loop a group of 32 inputs):
    R 1: 85 instructions for 16 weights a thread (5.3 a weight); R 2: 135 / 32 (4.2); R 4: 275 / 64 (4.3)
The decode alone is 2 instructions a weight (IMAD.SHL + LOP3 a nibble pair, twice) on both paths; here the rest is
64-bit pointer arithmetic a row a step, fragment moves and x's scalar gathers. So it does not beat the CUDA-core loop
as written; it could (~2.5 a weight) only with those overheads cut (one base pointer and immediate row offsets, x
loaded 16 bytes at a time and permuted in registers). Kept as a record, not used by the engine. Also: f16 operands
put x through f16 (bf16 activations past 65,504 would overflow), a range question a design must answer first.

    env -u TRITON_INTERPRET python benchmarks/mma_decode_census.py [R]
"""
import sys, torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon._runtime import GluonASTSource
sys.path.insert(0, __import__('os').path.dirname(__file__))
import sass_census as sc
from dsv4.receipts import emit

lines = ["{", ".reg .b32 m, s, t;", ".reg .b16 lo, hi;"]
for q in range(4):
    lines += [f"{'shl' if q < 3 else 'shr'}.b32 m, $8, {abs(9-4*q)};", "and.b32 m, m, 0x0E000E00;",
              (f"shl.b32 s, $8, {12-4*q};" if q < 3 else "mov.b32 s, $8;"), "and.b32 s, s, 0x80008000;",
              "or.b32 t, m, s;", f"mov.b32 {{${q}, ${q+4}}}, t;"]
lines.append("}")
PTX = gl.constexpr("\n".join(lines))

@gluon.jit
def _decode16(words):
    return gl.inline_asm_elementwise(PTX, "=h,=h,=h,=h,=h,=h,=h,=h,r", [words], dtype=(gl.float16,) * 8, is_pure=True, pack=1)

@gluon.jit
def _proto(x_ptr, w_ptr, s_ptr, h_ptr, K: gl.constexpr, S_STRIDE: gl.constexpr, NW: gl.constexpr, R: gl.constexpr):
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[NW, 1], instr_shape=[16, 8])
    AL: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    BL: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    WL: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=1)
    M: gl.constexpr = 16 * NW * R
    nb = gl.program_id(0)
    rows = nb * M + gl.arange(0, M, layout=gl.SliceLayout(1, WL))
    cw = gl.arange(0, 4, layout=gl.SliceLayout(0, WL))
    wp = w_ptr + gl.expand_dims(rows.to(gl.int64), 1) * (K // 8) + gl.expand_dims(cw, 0)
    kp = gl.arange(0, 32, layout=gl.SliceLayout(1, BL))  # logical k' = 16h + 8b + 2c + i
    h_ = kp // 16
    b_ = (kp // 8) % 2
    c_ = (kp // 2) % 4
    i_ = kp % 2
    phys = 8 * c_ + 2 * h_ + b_ + 4 * i_
    nn = gl.arange(0, 8, layout=gl.SliceLayout(0, BL))
    xp = x_ptr + gl.expand_dims(phys, 1) + gl.expand_dims(nn, 0) * 0
    srow = nb * M + gl.arange(0, M, layout=gl.SliceLayout(1, MMA))
    acc = gl.zeros([M, 8], gl.float32, MMA)
    for g in range(0, K // 32):
        words = gl.load(wp + g * 4)
        d = _decode16(words)  # q = 0..7, each [M, 4]
        # [M, c, (h b), i] -> [M, h, b, c, i]
        p0 = gl.join(d[0], d[4])  # q0 = 0: (h, b) = (0, 0)
        p1 = gl.join(d[1], d[5])  # (0, 1)
        p2 = gl.join(d[2], d[6])  # (1, 0)
        p3 = gl.join(d[3], d[7])  # (1, 1)
        hb0 = gl.join(p0, p1)  # [M, 4, 2(i), 2(b)]  h = 0
        hb1 = gl.join(p2, p3)  # h = 1
        t = gl.join(hb0, hb1)  # [M, c, i, b, h]
        t = gl.permute(t, [0, 4, 3, 1, 2])  # [M, h, b, c, i]
        a = gl.convert_layout(gl.reshape(t, [M, 32]), AL)
        xb = gl.load(xp + g * 32).to(gl.float16)
        part = mma_v2(a, xb, gl.zeros([M, 8], gl.float32, MMA))
        sc = gl.load(s_ptr + srow.to(gl.int64) * S_STRIDE + g)
        scale = (sc.to(gl.int32) << 23).to(gl.float32, bitcast=True) * 16384.0
        acc = acc + part * gl.expand_dims(scale, 1)
    out = gl.sum(acc, axis=1) * 0.125  # the 8 equal columns
    gl.store(h_ptr + srow, out.to(h_ptr.dtype.element_ty))

fn = _proto
sig = dict(x_ptr="*bf16", w_ptr="*i32", s_ptr="*u8", h_ptr="*bf16", K="constexpr", S_STRIDE="constexpr", NW="constexpr", R="constexpr")
consts = dict(K=4096, S_STRIDE=128, NW=4, R=int(sys.argv[1]) if len(sys.argv) > 1 else 2)
names = fn.arg_names
attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in sig if sig[n].startswith("*")}
src = GluonASTSource(fn=fn, signature=sig, constexprs={(names.index(n),): v for n, v in consts.items()}, attrs=attrs)
out = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
lines = sc.sass(out.asm["cubin"]); ins = sc.parse(lines); loop = sc.hottest_loop(ins)
emit("MMA_CENSUS", target="sm_90", tiles_a_warp=consts["R"], weights_a_thread_a_step=16 * consts["R"],
     resources=sc.resources(out.asm["cubin"]), instructions=len(ins), loop_instructions=len(loop),
     loop=dict(sorted(sc.census(loop).items(), key=lambda kv: -kv[1])))
