"""Device functions the Gluon kernels share (dsv4.kernels.moe_gl, qgemv_mma): the PDL wait, 5-d index ranges laid
out as a kernel's tile, and a thread's 4 consecutive values split into 4 tensors (the same registers)."""

from __future__ import annotations

from . import PDL

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
except ImportError:  # no Gluon: the kernels that use these are never built
    gluon, gl = None, None


def _jit(fn=None, **options):
    if fn is None:
        return lambda f: _jit(f, **options)
    return fn if gluon is None else gluon.jit(fn, **options)


GPU_CHECKED = True  # moe_gl's own functions (GPU-checked since session 14), moved here in session 27: the same SASS
_PDL = gl.constexpr(PDL) if gl is not None else PDL  # read at import, as dsv4.kernels reads it


@_jit
def _pdl_wait():
    """dsv4.kernels.pdl_wait, in a kernel launched with launch_pdl: the previous kernel complete and its writes
    visible, then the next one released."""
    if _PDL:
        gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)


@_jit
def _prefetch_l2(ptrs):
    """Each pointer's line fetched into L2 (prefetch.global.L2): no register holds it and nothing waits for it, so a
    program may issue it before its wait for lines it will load after (moe_gl CONFIG down_prefetch)."""
    gl.inline_asm_elementwise("prefetch.global.L2 [$1]; // dummy $0", "=r,l", [ptrs], dtype=gl.int32, is_pure=False,
                              pack=1)


@_jit
def _globaltimer():
    """The GPU's global nanosecond timer (%globaltimer), for moe_gl CONFIG stamps: when a program got where."""
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer; // $0", "=l", [], dtype=gl.int64, is_pure=False,
                                     pack=1)


@_jit
def _stamp(st_ptr, t0, t1, kind):
    """A program's stamps (moe_gl CONFIG stamps): [its start, t1 (-1 where not taken), its end, kind] int64."""
    gl.store(st_ptr, t0)
    gl.store(st_ptr + 1, t1)
    gl.store(st_ptr + 2, _globaltimer())
    gl.store(st_ptr + 3, kind.to(gl.int64))


@_jit
def _arange5(n: gl.constexpr, dim: gl.constexpr, L5: gl.constexpr):
    """arange(n) along dim of a 5-d layout L5, broadcastable in L5 (size 1 on the other dims): laid out as L5 sliced
    on every other dim (the last first: a slice's dims are its parent's less one), then expanded back."""
    S: gl.constexpr = gl.SliceLayout
    L4: gl.constexpr = S(4, L5)
    layout: gl.constexpr = (S(1, S(2, S(3, L4))) if dim == 0 else S(0, S(2, S(3, L4))) if dim == 1 else
                            S(0, S(1, S(3, L4))) if dim == 2 else S(0, S(1, S(2, L4))) if dim == 3 else
                            S(0, S(1, S(2, S(3, L5)))))
    return _expanded(gl.arange(0, n, layout=layout), dim)


@_jit
def _expanded(v, dim: gl.constexpr):
    """v [n] -> 5 dims, n on dim (its layout is a slice of the 5-d layout on the others)."""
    for d in gl.static_range(5):
        if d != dim:
            v = gl.expand_dims(v, d)
    return v


@_jit
def _split4(v, L4: gl.constexpr):
    """A thread's 4 consecutive values v [a, b, c, d, 4] -> the 4 slices [a, b, c, d] in L4 (the same registers)."""
    s0, s1 = gl.split(gl.reshape(v, [v.shape[0], v.shape[1], v.shape[2], v.shape[3], 2, 2]))  # i = 2 i1 + i2
    v0, v2 = gl.split(s0)
    v1, v3 = gl.split(s1)
    return (gl.convert_layout(v0, L4), gl.convert_layout(v1, L4), gl.convert_layout(v2, L4),
            gl.convert_layout(v3, L4))


@_jit
def _mma_out_rows(nb, RT: gl.constexpr):
    """The rows (tile * 16 + g, int64) and lanes t of the sums of m16n8k16 accumulators laid out as [warps, RT, 8 g,
    4 t, 4] (moe_gl's _mma_rows, qgemv_mma), [RT, 8, 4] in their layout (that layout less the warps and the 4)."""
    L5: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, RT, 1, 1, 4], threads_per_warp=[1, 1, 8, 4, 1],
                                        warps_per_cta=[gl.num_warps(), 1, 1, 1, 1], order=[4, 3, 2, 1, 0])
    L3: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(4, L5))
    tile3 = gl.expand_dims(gl.expand_dims(gl.arange(0, RT, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3))), 1), 2)
    g3 = gl.expand_dims(gl.expand_dims(gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3))), 0), 2)
    t3 = gl.expand_dims(gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3))), 0), 1)
    return (nb * (16 * RT) + tile3 * 16 + g3).to(gl.int64) + 0 * t3, t3
