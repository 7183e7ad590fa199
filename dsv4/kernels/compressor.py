"""The compressor's pooling and the lightning indexer's scores, one launch each (references:
dsv4.model.compressor.compress and index_topk).

pool: every window a chunk touches, read in place from the ring and the chunk's projected rows (no
concatenated stream, no gathered window copies): softmax over the window's slots of gate + ape per
channel, the weighted sum of kv, RMSNorm with its weight, RoPE at the window's first position.
Rounding follows the reference: softmax in fp32, weights and each product rounded to the rows'
dtype, the sum rounded once. The softmax's denominator is accumulated online over slot blocks.

index_keys: each query's q (RoPE applied in the kernel) against the committed rows and the chunk's
new rows, relu(q.k) * dI**-0.5 weighted per head, summed over heads in a fixed order, masked to -inf
where not visible, and written as one int64 sort key per entry: the score's order-preserving bits
(negated) above the entry's index. The keys are distinct, so the k smallest are one set in one order
whatever the selection algorithm: descending score, ties to the lower index, exactly the
reference's stable descending sort (-0.0 counts as 0.0, as in the sort's comparison).

Pooled (POOLED, `ids`; dispatched by dsv4.kernels.pooled): B rows of one token each, row b's rings and
stores the slot ids[b] of stacked pool buffers, its chunk row kv[b] / q[b]; each touches one window.
A row's program does exactly the arithmetic of the same row launched alone.
"""

import os

import torch

from . import cdiv, device_function, launcher, next_pow2, pdl_wait, qgemv, row_stride, use_triton
from . import topk as topk_kernel

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # through benchmarks/gpu_checks.sh (session 3): "auto" runs it on CUDA

# Keys below this hold a finite score (above -inf): (~ordered(-inf)) << 32, ordered(-inf) = 0x807FFFFF.
_VISIBLE_BELOW = 0x7F800000 << 32
# one_pass (DSV4_POOL_ONE_PASS=0 turns it off): a window whose slots are one block (CSA's 8 and HCA's 128 at one
# token) loads its gates and rows together and weighs the rows from the gates it holds (_pool_window's ONE_PASS), where
# two passes reload the gates: the same bits. pair (DSV4_POOL_PAIR=0 turns it off): a CSA layer's two pools, the
# compressor's and its indexer's, over the same windows in one launch (pool_pair): the same bits, a launch fewer a CSA
# layer. Both on by default since session 34 (call 1, mini's decode_ab in one process, pipelined tok/s: defaults
# 876.98, one_pass 877.34, pair 883.32 (+0.7 %), both with layout's xproj_first 886.21 (+1.05 %); the same stream).
# ticket_norm (DSV4_POOL_TICKET_NORM=0 turns it off): a channel-split pool (HCA's 128 slots x 512 channels) norms and
# rotates each window's row in its last program (_pool_kernel's TICKET), not in a second launch: the same operations on
# the same rounded row, a launch fewer an HCA layer (Flash: 20 a token). GPU-checked in session 34 (its CUDA test;
# with it on, the replay and pool tests and the gate, the same stream); on mini's one HCA layer within the rows' spread
# (call 3: pipelined 901.73 against 900.78 tok/s). On by default since session 43: at a Flash rank's shapes
# (benchmarks/rank_proxy.py, call 2's decode_ab, 6 rounds) graph +0.74 %, pipelined +0.93 %, 830 -> 810 kernel nodes,
# the same stream.
CONFIG = {"one_pass": os.environ.get("DSV4_POOL_ONE_PASS", "1") == "1",
          "pair": os.environ.get("DSV4_POOL_PAIR", "1") == "1",
          "ticket_norm": os.environ.get("DSV4_POOL_TICKET_NORM", "1") == "1",
          "early": os.environ.get("DSV4_POOL_EARLY", "1") == "1"}
# early (DSV4_POOL_EARLY=0 turns it off): where the caller says so (pool's, pool_pair's and index_keys' `early`:
# dsv4.model.attention makes the step's window geometry and the stacked x linear before q's latent, so a pool follows
# kernels whose outputs it does not read, and the index keys follow the pool), the pools run before their PDL wait
# (DSV4_PDL: the kernel two back is complete when one starts), their stores after it, and the index keys load the
# queries, head weights and stored keys before it, this step's new keys after it. The same operations: the same bits
# (the gate's stream unchanged). On by default since session 35 (call 1, mini's decode_ab in one process: pipelined
# 903.0 -> 907.4 tok/s, +0.5 % in every round; graph 834.6 -> 838.3). The same form for the experts' kernel 2 (its
# terms while the shared expert's down GEMV runs) measured -0.9 % and for the attention's split (its first tile of keys
# while q's norm and rope run) -0.2 %: both removed (kept in commit 0461baf).
POOL_SPLIT_ABOVE = 8192  # slots x channels of a window above which pool splits channels over programs
POOL_CHANNELS = 64
INDEX_BLOCK = 64  # entries per index_keys program (half that above 64 heads)


def _pool_kernel(kv_ptr, gate_ptr, ring_kv_ptr, ring_gate_ptr, ape_ptr, norm_ptr, cur_ptr, prev_ptr, live_ptr,
                 cos_ptr, sin_ptr, out_ptr, ids_ptr, ticket_ptr, final_ptr, eps, R, kv_stride, gate_stride,
                 M: constexpr, DIM: constexpr, WIDTH: constexpr, SLOTS: constexpr, OVERLAP: constexpr, HALF: constexpr,
                 BS: constexpr, CB: constexpr, POOLED: constexpr, ONE_PASS: constexpr, TICKET: constexpr,
                 EARLY: constexpr = 0):
    """CB == DIM: one program per window does everything. CB < DIM: programs (window, channel block)
    only pool (the softmax is per channel), leaving the rounded pooled rows in out for _norm_rope_kernel, or, with
    TICKET (CONFIG ticket_norm), for the window's last program to finish (an int32 ticket a window, put back to 0),
    which norms and rotates the row into final as _norm_rope_kernel does.
    POOLED: window w is row w's (one each): its slot's rings, its own chunk row. The chunk's rows are kv_stride and
    gate_stride apart (column views of one wider output: dsv4.layout CONFIG fuse_xproj).
    EARLY (CONFIG early, where the caller says every input was written two or more kernels back): the pool before the
    program's wait, its stores after it."""
    if not EARLY:
        pdl_wait()
    w = tl.program_id(0).to(tl.int64)
    _pool_window(w, tl.program_id(1), kv_ptr, gate_ptr, ring_kv_ptr, ring_gate_ptr, ape_ptr, norm_ptr, cur_ptr,
                 prev_ptr, live_ptr, cos_ptr, sin_ptr, out_ptr, ids_ptr, eps, R, kv_stride, gate_stride, M, DIM, WIDTH,
                 SLOTS, OVERLAP, HALF, BS, CB, POOLED, ONE_PASS, EARLY)
    if TICKET:
        tl.debug_barrier()  # every thread's channels stored before the ticket's release
        if tl.atomic_add(ticket_ptr + w, 1, sem="acq_rel", scope="gpu") == DIM // CB - 1:
            # the row's other blocks from L2 (.cg: L1 is not coherent across SMs)
            pooled = tl.load(out_ptr + w * DIM + tl.arange(0, DIM), cache_modifier=".cg").to(tl.float32)
            _norm_rope(pooled, norm_ptr, cos_ptr, sin_ptr, final_ptr, w, eps, DIM, HALF)
            tl.store(ticket_ptr + w, 0)


def _pool_pair_kernel(kv_ptr, gate_ptr, ring_kv_ptr, ring_gate_ptr, ape_ptr, norm_ptr, out_ptr, R, kv_stride,
                      gate_stride, kv2_ptr, gate2_ptr, ring_kv2_ptr, ring_gate2_ptr, ape2_ptr, norm2_ptr, out2_ptr, R2,
                      kv2_stride, gate2_stride, cur_ptr, prev_ptr, live_ptr, cos_ptr, sin_ptr, ids_ptr, eps, n_win,
                      M: constexpr, SLOTS: constexpr, OVERLAP: constexpr, HALF: constexpr, POOLED: constexpr,
                      DIM: constexpr, WIDTH: constexpr, BS: constexpr, DIM2: constexpr, WIDTH2: constexpr,
                      BS2: constexpr, ONE_PASS: constexpr, ONE_PASS2: constexpr, EARLY: constexpr = 0):
    """Two compressors' pools over the same windows in one launch (a CSA layer's compressor and its indexer's):
    programs w < n_win pool the first's window w, the others the second's window w - n_win, each the whole of
    _pool_kernel's one-program window (CB == DIM), so each entry has the bits of its own launch. EARLY: as
    _pool_kernel's."""
    if not EARLY:
        pdl_wait()
    p = tl.program_id(0).to(tl.int64)
    if p < n_win:
        _pool_window(p, 0, kv_ptr, gate_ptr, ring_kv_ptr, ring_gate_ptr, ape_ptr, norm_ptr, cur_ptr, prev_ptr,
                     live_ptr, cos_ptr, sin_ptr, out_ptr, ids_ptr, eps, R, kv_stride, gate_stride, M, DIM, WIDTH,
                     SLOTS, OVERLAP, HALF, BS, DIM, POOLED, ONE_PASS, EARLY)
    else:
        _pool_window(p - n_win, 0, kv2_ptr, gate2_ptr, ring_kv2_ptr, ring_gate2_ptr, ape2_ptr, norm2_ptr, cur_ptr,
                     prev_ptr, live_ptr, cos_ptr, sin_ptr, out2_ptr, ids_ptr, eps, R2, kv2_stride, gate2_stride, M,
                     DIM2, WIDTH2, SLOTS, OVERLAP, HALF, BS2, DIM2, POOLED, ONE_PASS2, EARLY)


@device_function
def _slot_rows(w, j, inside, prev_ptr, cur_ptr, live_ptr, M: constexpr, DIM: constexpr, OVERLAP: constexpr):
    """Slots j of window w: (stream row, live, whether a previous-window slot, the slot's ape row, its column)."""
    if OVERLAP:  # slots [0, M): the previous window's first-half channels; [M, 2M): this window's second half
        is_prev = j < M
        jj = tl.where(is_prev, j, j - M)
        col = tl.where(is_prev, 0, DIM)
    else:
        is_prev = j < 0
        jj = j
        col = j * 0
    row = tl.where(is_prev, tl.load(prev_ptr + w * M + jj, mask=inside & is_prev, other=0),
                   tl.load(cur_ptr + w * M + jj, mask=inside & ~is_prev, other=0))
    live = inside & (~is_prev | (tl.load(live_ptr + w * M + jj, mask=inside & is_prev, other=0) != 0))
    return row, live, jj, col


@device_function
def _pool_window(w, cblock, kv_ptr, gate_ptr, ring_kv_ptr, ring_gate_ptr, ape_ptr, norm_ptr, cur_ptr, prev_ptr,
                 live_ptr, cos_ptr, sin_ptr, out_ptr, ids_ptr, eps, R, kv_stride, gate_stride, M: constexpr,
                 DIM: constexpr, WIDTH: constexpr, SLOTS: constexpr, OVERLAP: constexpr, HALF: constexpr,
                 BS: constexpr, CB: constexpr, POOLED: constexpr, ONE_PASS: constexpr, EARLY: constexpr):
    """Window w's channel block cblock (_pool_kernel's program). ONE_PASS (the window's slots one block, SLOTS <= BS):
    the gates and the rows are loaded together and the weights computed from the gates already held, where two passes
    reload the gates after the softmax's denominator: the same operations on the same values, one round trip less.
    EARLY: the program's PDL wait after the pool, before its stores."""
    if POOLED:
        slot = tl.load(ids_ptr + w)
        ring_kv_ptr += slot * R * WIDTH
        ring_gate_ptr += slot * R * WIDTH
        kv_ptr += w * kv_stride
        gate_ptr += w * gate_stride
    c = cblock * CB + tl.arange(0, CB)
    s = tl.arange(0, BS)
    dt = out_ptr.dtype.element_ty

    # Pass 1: per channel, the running max of gate + ape over the slots and the sum of exp below it.
    mx = tl.full([CB], float("-inf"), tl.float32)
    den = tl.zeros([CB], tl.float32)
    acc = tl.zeros([CB], tl.float32)
    if ONE_PASS:
        inside = s < SLOTS
        row, live, jj, col = _slot_rows(w, s, inside, prev_ptr, cur_ptr, live_ptr, M, DIM, OVERLAP)
        in_ring = row < R
        off = col[:, None] + c[None, :]
        ok = live[:, None] & (c[None, :] < DIM)
        ring_ok = ok & in_ring[:, None]
        new_ok = ok & ~in_ring[:, None]
        g = tl.where(in_ring[:, None], tl.load(ring_gate_ptr + row[:, None] * WIDTH + off, mask=ring_ok, other=0.0),
                     tl.load(gate_ptr + (row - R)[:, None] * gate_stride + off, mask=new_ok, other=0.0))
        v = tl.where(in_ring[:, None], tl.load(ring_kv_ptr + row[:, None] * WIDTH + off, mask=ring_ok, other=0.0),
                     tl.load(kv_ptr + (row - R)[:, None] * kv_stride + off, mask=new_ok, other=0.0))
        g = g.to(tl.float32) + tl.load(ape_ptr + jj[:, None] * WIDTH + off, mask=ok, other=0.0)
        g = tl.where(ok, g, float("-inf"))
        new_mx = tl.maximum(mx, tl.max(g, axis=0))
        shift = tl.where(new_mx == float("-inf"), 0.0, new_mx)
        den = den * tl.exp(mx - shift) + tl.sum(tl.exp(g - shift[None, :]), axis=0)
        mx = new_mx
        p = tl.where(ok, tl.exp(g - mx[None, :]) / den[None, :], 0.0).to(dt).to(tl.float32)
        acc += tl.sum((v.to(tl.float32) * p).to(dt).to(tl.float32), axis=0)
    else:
        for s0 in range(0, SLOTS, BS):
            j = s0 + s
            inside = j < SLOTS
            row, live, jj, col = _slot_rows(w, j, inside, prev_ptr, cur_ptr, live_ptr, M, DIM, OVERLAP)
            in_ring = row < R
            off = col[:, None] + c[None, :]
            ok = live[:, None] & (c[None, :] < DIM)
            g = tl.where(in_ring[:, None],
                         tl.load(ring_gate_ptr + row[:, None] * WIDTH + off, mask=ok & in_ring[:, None], other=0.0),
                         tl.load(gate_ptr + (row - R)[:, None] * gate_stride + off, mask=ok & ~in_ring[:, None],
                                 other=0.0))
            g = g.to(tl.float32) + tl.load(ape_ptr + jj[:, None] * WIDTH + off, mask=ok, other=0.0)
            g = tl.where(ok, g, float("-inf"))
            new_mx = tl.maximum(mx, tl.max(g, axis=0))
            # A block of dead slots only (the first window's previous half) leaves the max at -inf: no -inf - -inf.
            shift = tl.where(new_mx == float("-inf"), 0.0, new_mx)
            den = den * tl.exp(mx - shift) + tl.sum(tl.exp(g - shift[None, :]), axis=0)
            mx = new_mx

        # Pass 2: the weights (rounded to the rows' dtype) times kv, each product rounded, summed in fp32.
        for s0 in range(0, SLOTS, BS):
            j = s0 + s
            inside = j < SLOTS
            row, live, jj, col = _slot_rows(w, j, inside, prev_ptr, cur_ptr, live_ptr, M, DIM, OVERLAP)
            in_ring = row < R
            off = col[:, None] + c[None, :]
            ok = live[:, None] & (c[None, :] < DIM)
            ring_ok = ok & in_ring[:, None]
            new_ok = ok & ~in_ring[:, None]
            g = tl.where(in_ring[:, None],
                         tl.load(ring_gate_ptr + row[:, None] * WIDTH + off, mask=ring_ok, other=0.0),
                         tl.load(gate_ptr + (row - R)[:, None] * gate_stride + off, mask=new_ok, other=0.0))
            g = g.to(tl.float32) + tl.load(ape_ptr + jj[:, None] * WIDTH + off, mask=ok, other=0.0)
            p = tl.where(ok, tl.exp(g - mx[None, :]) / den[None, :], 0.0).to(dt).to(tl.float32)
            v = tl.where(in_ring[:, None],
                         tl.load(ring_kv_ptr + row[:, None] * WIDTH + off, mask=ring_ok, other=0.0),
                         tl.load(kv_ptr + (row - R)[:, None] * kv_stride + off, mask=new_ok, other=0.0))
            acc += tl.sum((v.to(tl.float32) * p).to(dt).to(tl.float32), axis=0)
    if EARLY:
        pdl_wait()
    if CB < DIM:
        tl.store(out_ptr + w * DIM + c, acc.to(dt))
    else:
        _norm_rope(acc.to(dt).to(tl.float32), norm_ptr, cos_ptr, sin_ptr, out_ptr, w, eps, DIM, HALF)


def _norm_rope_kernel(pooled_ptr, norm_ptr, cos_ptr, sin_ptr, out_ptr, eps, DIM: constexpr, HALF: constexpr):
    """RMSNorm and RoPE of the channel-split pool's rows (one program per window)."""
    pdl_wait()
    w = tl.program_id(0).to(tl.int64)
    pooled = tl.load(pooled_ptr + w * DIM + tl.arange(0, DIM)).to(tl.float32)
    _norm_rope(pooled, norm_ptr, cos_ptr, sin_ptr, out_ptr, w, eps, DIM, HALF)


@device_function
def _norm_rope(pooled, norm_ptr, cos_ptr, sin_ptr, out_ptr, w, eps, DIM: constexpr, HALF: constexpr):
    """A pooled row's RMSNorm (weighted) and RoPE at its window's first position, rounded as the reference."""
    dt = out_ptr.dtype.element_ty
    c = tl.arange(0, DIM)
    rstd = tl.rsqrt(tl.sum(pooled * pooled, axis=0) / DIM + eps)
    y = (pooled * rstd).to(dt).to(tl.float32)
    y = (tl.load(norm_ptr + c).to(tl.float32) * y).to(dt).to(tl.float32)

    even, odd = tl.split(tl.reshape(y, [DIM // 2, 2]))
    pair = tl.arange(0, DIM // 2)
    k = pair - (DIM // 2 - HALF)
    rot = k >= 0
    cs = tl.load(cos_ptr + w * HALF + k, mask=rot, other=1.0)
    sn = tl.load(sin_ptr + w * HALF + k, mask=rot, other=0.0)
    out = out_ptr + w * DIM + 2 * pair
    tl.store(out, tl.where(rot, even * cs - odd * sn, even).to(dt))
    tl.store(out + 1, tl.where(rot, odd * cs + even * sn, odd).to(dt))


def pool_supported(kv: torch.Tensor, ring_kv: torch.Tensor, ape: torch.Tensor, norm: torch.Tensor, cos: torch.Tensor,
                   overlap: bool) -> bool:
    width = kv.shape[-1]
    dim = width // 2 if overlap else width
    return (kv.dim() == 2 and row_stride(kv) is not None and ring_kv.is_contiguous() and ring_kv.dtype == kv.dtype
            and ape.dtype == torch.float32 and norm.dtype in (kv.dtype, torch.float32)
            and dim == next_pow2(dim) and dim >= 2 and cos.dtype == torch.float32 and 2 * cos.shape[-1] <= dim)


def _shape(kv, win, overlap: bool) -> tuple[int, int, int, int, int, int]:
    """(dim, slots, channel block, slot block, warps, one_pass) of a pool launch: from the shapes alone."""
    dim = kv.shape[-1] // 2 if overlap else kv.shape[-1]
    m = win.cur.shape[-1]
    slots = 2 * m if overlap else m
    # A long window (HCA's 128 slots x 512 channels) read by one program per window is one SM's worth of
    # bandwidth: split its channels over programs, then norm and rotate in a second launch.
    cb = min(dim, POOL_CHANNELS) if slots * dim > POOL_SPLIT_ABOVE else dim
    block = min(next_pow2(slots), max(1, 8192 // cb))
    return dim, slots, cb, block, 4 if cb * block <= 4096 else 8, CONFIG["one_pass"] and slots <= block


def pool(kv, gate, ring_kv, ring_gate, ape, norm, win, overlap: bool, eps: float, ids=None,
         early: bool = False) -> torch.Tensor:
    """Entries [n_win, dim] of the windows `win` of a chunk's projected rows kv, gate [T, width] (rows read in place
    wherever their channels are contiguous).
    Pooled (ids [B]): kv, gate [B, width] one row each, rings [slots, R, width], win of one window per row.
    early: the caller's word that every input was written two or more kernels before this launch (CONFIG early)."""
    width = kv.shape[-1]
    dim, slots, cb, block, warps, one_pass = _shape(kv, win, overlap)
    n_win, half = win.cur.shape[0], win.cos.shape[-1]
    out = torch.empty(n_win, dim, dtype=kv.dtype, device=kv.device)
    pooled = torch.empty_like(out) if cb < dim else out
    gate, gate_stride = _in_place(gate)
    tickets = qgemv.tickets_for(n_win, kv.device) if cb < dim and CONFIG["ticket_norm"] else None
    launcher(_pool_kernel, kv)[(n_win, dim // cb)](
        kv, gate, ring_kv, ring_gate.contiguous(), ape.contiguous(), norm.contiguous(),
        win.cur.contiguous(), win.prev.contiguous(), win.prev_live.contiguous(), win.cos.contiguous(),
        win.sin.contiguous(), pooled, kv if ids is None else ids, pooled if tickets is None else tickets, out,
        float(eps), ring_kv.shape[-2], row_stride(kv), gate_stride, M=win.cur.shape[-1], DIM=dim, WIDTH=width,
        SLOTS=slots, OVERLAP=overlap, HALF=half, BS=block, CB=cb, POOLED=ids is not None, ONE_PASS=one_pass,
        TICKET=tickets is not None, **_early(early), num_warps=warps)
    if cb < dim and tickets is None:
        launcher(_norm_rope_kernel, kv)[(n_win,)](pooled, norm.contiguous(), win.cos.contiguous(),
                                                  win.sin.contiguous(), out, float(eps), DIM=dim, HALF=half)
    return out


def pair_supported(a: tuple, b: tuple, win, overlap: bool) -> bool:
    """Two pools over the same windows in one launch (pool_pair): a and b (kv, gate, ring_kv, ring_gate, ape, norm)
    each one pool takes (pool_supported), each window one program (no channel split) and their warps the same."""
    if not all(pool_supported(t[0], t[2], t[4], t[5], win.cos, overlap) for t in (a, b)):
        return False
    sa, sb = _shape(a[0], win, overlap), _shape(b[0], win, overlap)
    return sa[2] == sa[0] and sb[2] == sb[0] and sa[4] == sb[4] and a[0].dtype == b[0].dtype


def pool_pair(a: tuple, b: tuple, win, overlap: bool, eps: float, ids=None,
              early: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """pool(*a, win, ...) and pool(*b, win, ...) in one launch (pair_supported): their entries, each with the bits
    of its own launch (early: pool's)."""
    dims, outs, runtime = [], [], []
    for kv, gate, ring_kv, ring_gate, ape, norm in (a, b):
        dim, slots, _, block, warps, one_pass = _shape(kv, win, overlap)
        out = torch.empty(win.cur.shape[0], dim, dtype=kv.dtype, device=kv.device)
        gate, gate_stride = _in_place(gate)
        runtime += [kv, gate, ring_kv, ring_gate.contiguous(), ape.contiguous(), norm.contiguous(), out,
                    ring_kv.shape[-2], row_stride(kv), gate_stride]
        dims.append((dim, kv.shape[-1], block, one_pass))
        outs.append(out)
    n_win = win.cur.shape[0]
    (dim, width, block, one_pass), (dim2, width2, block2, one_pass2) = dims
    launcher(_pool_pair_kernel, a[0])[(2 * n_win,)](
        *runtime, win.cur.contiguous(), win.prev.contiguous(), win.prev_live.contiguous(), win.cos.contiguous(),
        win.sin.contiguous(), a[0] if ids is None else ids, float(eps), n_win, M=win.cur.shape[-1], SLOTS=slots,
        OVERLAP=overlap, HALF=win.cos.shape[-1], POOLED=ids is not None, DIM=dim, WIDTH=width, BS=block, DIM2=dim2,
        WIDTH2=width2, BS2=block2, ONE_PASS=one_pass, ONE_PASS2=one_pass2, **_early(early), num_warps=warps)
    return outs[0], outs[1]


def _early(early: bool) -> dict:
    """A launch's EARLY constant where the caller allows it and CONFIG early is on; {} (compiled as before) else."""
    return {"EARLY": 1} if early and CONFIG["early"] else {}


def _in_place(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Rows [rows, width] and their stride: t itself where each row is contiguous (a column view of a wider output
    among them), else a contiguous copy."""
    stride = row_stride(t)
    return (t, stride) if stride is not None else (t.contiguous(), t[0].numel())


def _index_keys_kernel(q_ptr, wts_ptr, cos_ptr, sin_ptr, icomp_ptr, inew_ptr, committed_ptr, visible_ptr, keys_ptr,
                       ids_ptr, Ns, N, n_win, wts_stride, w_scale, q_scale, H: constexpr, H_PAD: constexpr,
                       DI: constexpr, HALF: constexpr, BN: constexpr, IEEE: constexpr, POOLED: constexpr,
                       EARLY: constexpr = 0):
    """EARLY (CONFIG early, where the caller says only inew comes from the kernel before): everything else loaded
    before the PDL wait, the new rows after it."""
    if not EARLY:
        pdl_wait()
    t = tl.program_id(0).to(tl.int64)
    if POOLED:  # t is a row: its slot's stored keys, its own new rows and committed mask
        icomp_ptr += tl.load(ids_ptr + t) * Ns * DI
        inew_ptr += t * n_win * DI
        committed_ptr += t * Ns
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    h = tl.arange(0, H_PAD)
    d = tl.arange(0, DI)
    has_h = h < H
    dt = q_ptr.dtype.element_ty

    # q's RoPE as the reference's apply_rope: pairs (2i, 2i+1) of the trailing 2 * HALF channels, fp32, rounded.
    heads = q_ptr + t * H * DI + h[:, None] * DI
    x = tl.load(heads + d[None, :], mask=has_h[:, None], other=0.0).to(tl.float32)
    partner = tl.load(heads + (d ^ 1)[None, :], mask=has_h[:, None], other=0.0).to(tl.float32)
    rot = d >= DI - 2 * HALF
    k = (d - (DI - 2 * HALF)) // 2
    cs = tl.load(cos_ptr + t * HALF + k, mask=rot, other=1.0)[None, :]
    sn = tl.load(sin_ptr + t * HALF + k, mask=rot, other=0.0)[None, :]
    rotated = tl.where((d % 2 == 1)[None, :], x * cs + partner * sn, x * cs - partner * sn)
    q = tl.where(rot[None, :], rotated, x).to(dt)

    stored = n < Ns
    new = (n >= Ns) & (n < N)
    kept = tl.load(icomp_ptr + n[:, None] * DI + d[None, :], mask=stored[:, None], other=0.0)
    if EARLY:
        pdl_wait()
    rows = tl.where(stored[:, None], kept, tl.load(inew_ptr + (n - Ns)[:, None] * DI + d[None, :], mask=new[:, None],
                                                   other=0.0))
    if IEEE:
        dots = tl.dot(q, tl.trans(rows), input_precision="ieee")  # [H_PAD, BN]
    else:
        dots = tl.dot(q, tl.trans(rows))  # bf16/fp16 products are exact in the fp32 accumulator
    wts = tl.load(wts_ptr + t * wts_stride + h, mask=has_h, other=0.0).to(tl.float32) * w_scale
    score = tl.sum((tl.maximum(dots, 0.0) * q_scale) * wts[:, None], axis=0)

    vis = tl.where(stored, tl.load(committed_ptr + n, mask=stored, other=0) != 0,
                   tl.load(visible_ptr + t * n_win + (n - Ns), mask=new, other=0) != 0)
    score = tl.where(vis, score, float("-inf"))
    score = tl.where(score == 0.0, 0.0, score)
    bits = score.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # signed int32 order = float order
    key = ((~ordered).to(tl.int64) << 32) | n.to(tl.int64)
    tl.store(keys_ptr + t * N + n, key, mask=n < N)


def index_supported(q: torch.Tensor, icomp: torch.Tensor, inew: torch.Tensor, cos: torch.Tensor) -> bool:
    dI = q.shape[-1]
    return (q.dim() == 3 and q.is_contiguous() and icomp.is_contiguous() and q.dtype == icomp.dtype == inew.dtype
            and dI == next_pow2(dI) and dI >= 16 and cos.dtype == torch.float32 and 2 * cos.shape[-1] <= dI
            and icomp.shape[-2] + inew.shape[-2] < 2 ** 31)


def index_keys(q, weights, cos, sin, icomp, inew, committed, visible, ids=None, early: bool = False) -> torch.Tensor:
    """Sort keys [T, Ns + n_win] int64 of q [T, heads, dI] (before RoPE) against [icomp | inew]; the head weights
    [T, heads] read in place wherever each row's are contiguous.
    Pooled (ids [B], T = B rows of one token): icomp [slots, Ns, dI], inew [B, n_win, dI], committed [B, Ns].
    early: the caller's word that every input but inew was written two or more kernels before this launch."""
    T, H, dI = q.shape
    Ns, n_win = icomp.shape[-2], inew.shape[-2]
    N = Ns + n_win
    keys = torch.empty(T, N, dtype=torch.int64, device=q.device)
    block = INDEX_BLOCK if H <= 64 else INDEX_BLOCK // 2
    weights, wts_stride = _in_place(weights)
    launcher(_index_keys_kernel, q)[(T, cdiv(N, block))](
        q, weights, cos.contiguous(), sin.contiguous(), icomp, inew.contiguous(),
        committed.contiguous(), visible.contiguous(), keys, q if ids is None else ids, Ns, N, n_win, wts_stride,
        float(H ** -0.5), float(dI ** -0.5), H=H, H_PAD=max(16, next_pow2(H)), DI=dI, HALF=cos.shape[-1], BN=block,
        IEEE=q.dtype == torch.float32, POOLED=ids is not None, **_early(early), num_warps=4)
    return keys


def topk(keys: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(selected [T, k] entry indices, valid [T, k]): the k smallest keys, ascending. A key's low bits are its
    own column in `keys`, so top-k's indices are the entries' indices (no launch to mask them out). Rows of at
    most topk_kernel.MAX_N keys: one launch (dsv4.kernels.topk); longer ones torch.topk and a compare."""
    if use_triton(keys, gpu_checked=topk_kernel.GPU_CHECKED) and topk_kernel.supported(keys, k):
        return topk_kernel.smallest(keys, k, _VISIBLE_BELOW)
    top = torch.topk(keys, k, dim=-1, largest=False, sorted=True)
    return top.indices, top.values < _VISIBLE_BELOW
