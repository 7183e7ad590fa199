"""The routed experts of a decode step in two launches (reference: dsv4.model.moe.routed).

Kernel 1 (_gate_up_kernel): for each (token, selected expert) row that this rank owns, gate (w1)
and up (w3) read in one program from their stored FP4/FP8 bytes, then the SwiGLU activation:
h = silu(gate clamped above) * (up clamped both ways), h [T * k, I]. Kernel 2 (_down_kernel): for
each token, the down projection (w2) of each selected local expert and the routing-weighted sum
over the k experts in their routing order (a fixed order, no atomics: deterministic). An expert
another rank owns is skipped in both kernels before any weight load: it reads no byte and adds
nothing (the reference adds its output times weight 0).

Rounding follows the reference: each projection's output, the activation's silu and product, each
expert's output and its product with the routing weight are rounded to x's dtype; sums are fp32.

The same kernel 1 runs the shared expert's gate and up (one FP8 weight pair, no routing).

Kernel 1's options (CONFIG; a GPU sweep, benchmarks/moe_bench.py, decides):
- split-K ("gate_up_split_k", "shared_split_k"; 1: off): SPLITS programs per (row, row block) each
  sum a K chunk of gate and up into fp32 partials [rows, SPLITS, 2, I]; the last to finish (an int32
  ticket, as qgemv's fused split sum) sums them in split order and applies the activation, or with
  "fused_sum" off a second launch (_gate_up_sum_kernel) does the same (same bits). The split is
  CONFIG's alone, never the rows': a row's bits do not depend on the batch. Summing per chunk changes
  the fp32 order against the unsplit kernel (agreement to the reference's tolerance, not bits).
- "compact": the program of row slot j takes the j-th row this rank owns (a prefix count over ids in
  each program, no host sync), so the working programs come first in the grid and the programs of
  rows owned elsewhere are all at its end; the same sums as without (equal bits).
"""

import os

import torch

from ..formats import FP8_BLOCK, QWeight
from . import cdiv, device_function, interpreting, launcher, moe_gl, next_pow2, pdl_wait
from .qgemv import MAX_ROWS, _destination, _fp4_pair, _fp4_rows, _fp8_rows, _operands, tickets_for

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # through benchmarks/gpu_checks.sh (session 3): "auto" runs it on CUDA
# Rows per program and inputs per K tile of each kernel (FP8 tiles a multiple of 128 inputs, FP4 of 32),
# and warps; kernel 1's split-K for the routed and the shared expert (1: none), whether its splits are summed
# in its own launch (the ticket reduce; used only when split), and compact rows (see the docstring).
# benchmarks/qgemv_bench.py and benchmarks/moe_bench.py sweep them. The shared expert's gate/up has few rows
# (I / ranks) and no routing: narrower programs fill the SMs; its split-K 4 (session 6, moe_bench on an H200:
# Flash's shared gate/up at 1 row 12.0 -> 6.4 us, bits equal to the unsplit launch at 1 and 4 rows).
# prefill_pair_tokens: prefill chunks of at most this many tokens take these kernels too (dsv4.model.moe.routed),
# one row per (token, expert) pair: on Flash a 64-token chunk's grouped paths cost 6-7 ms per layer, for their
# unpacking of the layer's experts whole (benchmarks/prefill_moe_bench.py, session 6).
# shared_add: `routed`'s `add` operand (the shared expert's output) is added in kernel 2's store, one launch
# fewer per layer; off (DSV4_SHARED_ADD=0): a torch add after it (the same bits: the routed sum rounded, plus add,
# rounded once). On since session 7 call 1 (replay and pool tests on CUDA with it in the graphs).
# gate_up_paired (DSV4_MOE_PAIRED=0 turns it off): FP4 gate and up summed in one loop (qgemv._fp4_pair: both tiles
# in flight, x loaded once for both; equal bits). down_split_experts (DSV4_MOE_DOWN_SPLIT=0 turns it off): kernel 2
# with a program per (row block, token, expert) and a ticketed sum in routing order (_down_split_kernel; equal bits
# in bf16/fp16; fp32 keeps the plain kernel 2), for launches of at most down_split_tokens tokens. Session 8's
# counters showed one-row expert kernels at 13 % occupancy, latency-bound; on by default since session 8 call 3
# (RESULTS.md: flash decode 111.5 -> 115.4 tok/s in one call; one Flash layer's routed experts at one token
# 42.8 -> 41.7 us, at 16 tokens 327.6 -> 318.3 us paired alone but 332.9 with the split: hence the token bound).
# shared_launch (DSV4_MOE_SHARED_LAUNCH=0 turns it off; on since session 8 call 4): the shared expert's gate/up in the
# routed kernel 1's launch (routed_and_shared_gate_up: both read only x; one launch a layer fewer, equal bits).
# A prefill chunk's experts run on the tensor cores instead (dsv4.kernels.moe_tc, chosen in dsv4.model.moe). (Session
# 13 call 1 rejected grouping pairs by expert for these kernels: R pairs a group each paid their own multiply-adds,
# 3.5 ms against 0.6 for one Flash layer's routed experts at 16 tokens.)
CONFIG = {"prefill_pair_tokens": 128, "gate_up_block_n": 16, "down_block_n": 16, "shared_block_n": 4,
          "block_k_fp4": 1024, "block_k_fp8": 512, "num_warps": 4, "gate_up_split_k": 1, "shared_split_k": 4, "fused_sum": True, "compact": False,
          "shared_add": os.environ.get("DSV4_SHARED_ADD", "1") == "1",
          "gate_up_paired": os.environ.get("DSV4_MOE_PAIRED", "1") == "1",
          "down_split_experts": os.environ.get("DSV4_MOE_DOWN_SPLIT", "1") == "1", "down_split_tokens": 4,
          "shared_launch": os.environ.get("DSV4_MOE_SHARED_LAUNCH", "1") == "1",
          "shared_lane": os.environ.get("DSV4_MOE_SHARED_LANE", "0") == "1",
          "shared_prefill_tiles": os.environ.get("DSV4_MOE_SHARED_PREFILL_TILES", "1") == "1"}
# shared_lane (DSV4_MOE_SHARED_LANE=1 turns it on; off: session 43 call 8, mini's decode_ab 0.969 / 0.972 of the
# defaults, behind in every round; its CUDA test passed; a Flash rank's A/B not yet run): a decode step's
# shared expert as its own chain (its gate/up launch, then its down linear) on the device's lane (dsv4.kernels.lanes,
# in a captured step) while the router and the routed kernel 1 run, joined before kernel 2, which adds its output
# (dsv4.model.moe._shared_beside). A Flash rank's MoE is latency-bound (session 43's rank proxy: gate 2.2, router 2.3,
# kernel 1 15-19, the shared down 3-4, kernel 2 8-9 us a layer): the shared chain leaves the main one. Eager takes the
# same launches on one stream, so eager and graph keep one stream of bits; on the GPU these may differ from the
# default's (the Gluon kernel 1's shared programs against moe's shared gate/up).
# shared_prefill_tiles (DSV4_MOE_SHARED_PREFILL_TILES=0 turns it off; on since session 25): a short prefill chunk's
# shared expert as two v3 GEMVs (dsv4.model.moe._shared_fused), other bits than the fused kernel's, each row's its
# own. Session 25 call 1 (prefill_batch_bench --arm, one process, interleaved): a concurrency-16 server's 16 x 63
# wave on mini 88.4 -> 71.8 ms with it, 58.1 with moe_tc's wave tiles too.


@device_function
def _gate_up_program(nb, split, slot, nblocks, x_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, ids_ptr, h_ptr, p_ptr,
                     tickets_ptr, rows, I, first, n_local, w_expert_stride, s_expert_stride, row_skew, limit,
                     K: constexpr, S_STRIDE: constexpr, FP4: constexpr, E8M0: constexpr, TOPK: constexpr,
                     ROUTED: constexpr, BLOCK_N: constexpr, BLOCK_K: constexpr, SPLITS: constexpr,
                     K_CHUNK: constexpr, FUSED_SUM: constexpr, COMPACT: constexpr, ROWS_P2: constexpr,
                     PAIRED: constexpr, EARLY: constexpr = False):
    """Program (row block nb of nblocks, split, slot) of kernel 1. Row r: token r // TOPK, its expert ids[r]
    (ROUTED), or the one weight pair; with COMPACT, slot j runs the j-th local row. SPLITS > 1: fp32 partials
    at p_ptr, summed by the last of a (row, row block)'s programs (its ticket: tickets_ptr[r * nblocks + nb]).
    EARLY (the shared expert's programs in _gate_up_shared_kernel): pdl_wait while gate's first tile (both first
    tiles, paired) is in flight."""
    if COMPACT:
        r, e = _local_row(ids_ptr, slot, rows, first, n_local, ROWS_P2)
    elif ROUTED:
        r = slot.to(tl.int64)
        e = tl.load(ids_ptr + r).to(tl.int64) - first
    else:
        r = slot.to(tl.int64)
        e = r * 0
    n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    x_row = x_ptr + (r // TOPK) * K
    k_lo = split * K_CHUNK
    if (e >= 0) & (e < n_local):
        w1, s1 = w1_ptr + e * w_expert_stride, s1_ptr + e * s_expert_stride
        w3, s3 = w3_ptr + e * w_expert_stride, s3_ptr + e * s_expert_stride
        if FP4 and PAIRED:
            gate, up = _fp4_pair(x_row, w1, s1, w3, s3, n, I, k_lo, K_CHUNK, K, S_STRIDE, E8M0, BLOCK_N, BLOCK_K,
                                 EARLY)
        elif FP4:
            gate = _fp4_rows([x_row], w1, s1, n, I, k_lo, K_CHUNK, K, S_STRIDE, E8M0, BLOCK_N, BLOCK_K, EARLY)[0]
            up = _fp4_rows([x_row], w3, s3, n, I, k_lo, K_CHUNK, K, S_STRIDE, E8M0, BLOCK_N, BLOCK_K)[0]
        else:
            gate = _fp8_rows([x_row], w1, s1, n, I, row_skew, k_lo, K_CHUNK, K, S_STRIDE, E8M0, BLOCK_N,
                             BLOCK_K, EARLY)[0]
            up = _fp8_rows([x_row], w3, s3, n, I, row_skew, k_lo, K_CHUNK, K, S_STRIDE, E8M0, BLOCK_N,
                           BLOCK_K)[0]
        if SPLITS == 1:
            _swiglu_store(gate, up, h_ptr + r * I, n, I, limit)
        else:
            part = p_ptr + (r * SPLITS + split) * 2 * I + n
            tl.store(part, gate, mask=n < I)
            tl.store(part + I, up, mask=n < I)
            if FUSED_SUM:
                tl.debug_barrier()  # every thread's partials stored before the ticket's release
                ticket = tickets_ptr + r * nblocks + nb
                if tl.atomic_add(ticket, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:
                    _sum_swiglu_store(p_ptr + r * SPLITS * 2 * I, h_ptr + r * I, n, I, limit, SPLITS)
                    tl.store(ticket, 0)


def _gate_up_kernel(x_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, ids_ptr, h_ptr, p_ptr, tickets_ptr, rows, I, first, n_local,
                    w_expert_stride, s_expert_stride, row_skew, limit, K: constexpr, S_STRIDE: constexpr,
                    FP4: constexpr, E8M0: constexpr, TOPK: constexpr, ROUTED: constexpr, BLOCK_N: constexpr,
                    BLOCK_K: constexpr, SPLITS: constexpr, K_CHUNK: constexpr, FUSED_SUM: constexpr,
                    COMPACT: constexpr, ROWS_P2: constexpr, PAIRED: constexpr):
    """Grid (row blocks of I, SPLITS, T * TOPK): _gate_up_program."""
    pdl_wait()
    _gate_up_program(tl.program_id(0), tl.program_id(1), tl.program_id(2), tl.num_programs(0), x_ptr, w1_ptr,
                     s1_ptr, w3_ptr, s3_ptr, ids_ptr, h_ptr, p_ptr, tickets_ptr, rows, I, first, n_local,
                     w_expert_stride, s_expert_stride, row_skew, limit, K, S_STRIDE, FP4, E8M0, TOPK, ROUTED,
                     BLOCK_N, BLOCK_K, SPLITS, K_CHUNK, FUSED_SUM, COMPACT, ROWS_P2, PAIRED)


def _gate_up_shared_kernel(x_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, ids_ptr, h_ptr, p_ptr, sw1_ptr, ss1_ptr, sw3_ptr,
                           ss3_ptr, sh_ptr, sp_ptr, tickets_ptr, rows, T, I, SI, first, n_local, w_expert_stride,
                           s_expert_stride, row_skew, s_row_skew, limit, K: constexpr, S_STRIDE: constexpr, FP4: constexpr,
                           E8M0: constexpr, TOPK: constexpr, BLOCK_N: constexpr, BLOCK_K: constexpr,
                           SPLITS: constexpr, K_CHUNK: constexpr, COMPACT: constexpr, ROWS_P2: constexpr,
                           PAIRED: constexpr, BLOCKS: constexpr, SS_STRIDE: constexpr, S_FP4: constexpr,
                           S_E8M0: constexpr, S_BLOCK_N: constexpr, S_BLOCK_K: constexpr, S_SPLITS: constexpr,
                           S_K_CHUNK: constexpr, S_BLOCKS: constexpr):
    """Kernel 1 for the routed rows and the shared expert's in one launch (both read only x): a flat grid, the
    routed programs (BLOCKS x SPLITS x rows, in _gate_up_kernel's grid order) first, then the shared expert's
    (S_BLOCKS x S_SPLITS x T); each program is exactly the one of its own launch (same bits), the shared
    expert's tickets after the routed ones'. Launched with launch_pdl under DSV4_PDL: a routed program waits
    first (pdl_wait; its weights depend on the step's ids), a shared one once its first weight tile is in flight
    (EARLY)."""
    pid = tl.program_id(0)
    routed_programs = BLOCKS * SPLITS * rows
    if pid < routed_programs:
        pdl_wait()
        rest = pid // BLOCKS
        _gate_up_program(pid % BLOCKS, rest % SPLITS, rest // SPLITS, BLOCKS, x_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr,
                         ids_ptr, h_ptr, p_ptr, tickets_ptr, rows, I, first, n_local, w_expert_stride,
                         s_expert_stride, row_skew, limit, K, S_STRIDE, FP4, E8M0, TOPK, True, BLOCK_N, BLOCK_K, SPLITS,
                         K_CHUNK, True, COMPACT, ROWS_P2, PAIRED)
    else:
        q = pid - routed_programs
        rest = q // S_BLOCKS
        _gate_up_program(q % S_BLOCKS, rest % S_SPLITS, rest // S_SPLITS, S_BLOCKS, x_ptr, sw1_ptr, ss1_ptr,
                         sw3_ptr, ss3_ptr, ss1_ptr, sh_ptr, sp_ptr, tickets_ptr + rows * BLOCKS, T, SI, 0, 1, 0, 0,
                         s_row_skew, limit, K, SS_STRIDE, S_FP4, S_E8M0, 1, False, S_BLOCK_N, S_BLOCK_K, S_SPLITS,
                         S_K_CHUNK, True, False, 1, PAIRED, True)


@device_function
def _local_row(ids_ptr, slot, rows, first, n_local, ROWS_P2: constexpr):
    """(row, local expert) of the slot-th row (0-based, in row order) whose expert is this rank's, or
    (0, -1) when fewer rows are local: a prefix count over the launch's ids."""
    i = tl.arange(0, ROWS_P2)
    e = tl.load(ids_ptr + i, mask=i < rows, other=-1).to(tl.int64) - first
    mine = (i < rows) & (e >= 0) & (e < n_local)
    hit = mine & (tl.cumsum(mine.to(tl.int32), 0) == slot + 1)
    found = tl.sum(hit.to(tl.int32), 0) > 0
    r = tl.sum(tl.where(hit, i, 0), 0).to(tl.int64)
    return r, tl.where(found, tl.sum(tl.where(hit, e, 0), 0), -1)


@device_function
def _swiglu_store(gate, up, h_row, n, I, limit):
    """The reference's activation of fp32 gate/up sums: each rounded to h's dtype, the clamps, silu rounded,
    the product rounded."""
    dt = h_row.dtype.element_ty
    gate = tl.minimum(gate.to(dt).to(tl.float32), limit)
    up = tl.minimum(tl.maximum(up.to(dt).to(tl.float32), -limit), limit)
    act = (gate / (1.0 + tl.exp(-gate))).to(dt).to(tl.float32)
    tl.store(h_row + n, (act * up).to(dt), mask=n < I)


@device_function
def _sum_swiglu_store(p_row, h_row, n, I, limit, SPLITS: constexpr):
    """Gate and up of one row block summed over the row's partials [SPLITS, 2, I] in split order, then the
    activation. The loads go to L2 (.cg): other SMs wrote them, and L1 is not coherent across SMs."""
    gate = tl.zeros(n.shape, dtype=tl.float32)
    up = tl.zeros(n.shape, dtype=tl.float32)
    for sp in tl.static_range(SPLITS):
        gate += tl.load(p_row + sp * 2 * I + n, mask=n < I, other=0.0, cache_modifier=".cg")
        up += tl.load(p_row + (sp * 2 + 1) * I + n, mask=n < I, other=0.0, cache_modifier=".cg")
    _swiglu_store(gate, up, h_row, n, I, limit)


def _gate_up_sum_kernel(p_ptr, ids_ptr, h_ptr, I, first, n_local, limit, ROUTED: constexpr, SPLITS: constexpr,
                        BLOCK: constexpr):
    """Grid (blocks of I, rows): kernel 1's split partials of the local rows summed and activated (no fused sum)."""
    pdl_wait()
    r = tl.program_id(1).to(tl.int64)
    n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if ROUTED:
        e = tl.load(ids_ptr + r).to(tl.int64) - first
    else:
        e = r * 0
    if (e >= 0) & (e < n_local):
        _sum_swiglu_store(p_ptr + r * SPLITS * 2 * I, h_ptr + r * I, n, I, limit, SPLITS)


def _down_kernel(h_ptr, w_ptr, s_ptr, ids_ptr, wt_ptr, add_ptr, y_ptr, D, first, n_local, w_expert_stride,
                 s_expert_stride, I: constexpr, S_STRIDE: constexpr, FP4: constexpr, E8M0: constexpr, TOPK: constexpr,
                 ADD: constexpr, BLOCK_N: constexpr, BLOCK_K: constexpr):
    """Grid (row blocks of D, T): y[t] = sum over j < TOPK, expert ids[t, j] local, of wt[t, j] * w2 h[t * TOPK + j];
    with ADD, that sum rounded to y's dtype plus add[t], rounded again (the reference's `routed + shared`)."""
    pdl_wait()
    nb = tl.program_id(0)
    t = tl.program_id(1).to(tl.int64)
    n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    dt = y_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for j in range(TOPK):
        r = t * TOPK + j
        e = tl.load(ids_ptr + r).to(tl.int64) - first
        if (e >= 0) & (e < n_local):
            w, s = w_ptr + e * w_expert_stride, s_ptr + e * s_expert_stride
            if FP4:
                out = _fp4_rows([h_ptr + r * I], w, s, n, D, 0, I, I, S_STRIDE, E8M0, BLOCK_N, BLOCK_K)[0]
            else:
                out = _fp8_rows([h_ptr + r * I], w, s, n, D, 0, 0, I, I, S_STRIDE, E8M0, BLOCK_N, BLOCK_K)[0]
            weight = tl.load(wt_ptr + r).to(tl.float32)
            acc += (out.to(dt).to(tl.float32) * weight).to(dt).to(tl.float32)
    if ADD:
        acc = acc.to(dt).to(tl.float32) + tl.load(add_ptr + t * D + n, mask=n < D, other=0.0).to(tl.float32)
    tl.store(y_ptr + t * D + n, acc.to(dt), mask=n < D)


@device_function
def _down_sum_store(p_ptr, add_ptr, y_ptr, t, n, D, TOPK: constexpr, ADD: constexpr):
    """Token t's expert terms [TOPK, D] (fp32 holding y's dtype; 0 for another rank's expert) summed in routing
    order, then _down_kernel's store: its sum to the bit (adding 0.0 to an fp32 sum that starts at +0.0 changes
    no bit). The loads go to L2 (.cg): other SMs wrote them."""
    dt = y_ptr.dtype.element_ty
    acc = tl.zeros(n.shape, dtype=tl.float32)
    for j in tl.static_range(TOPK):
        acc += tl.load(p_ptr + (t * TOPK + j) * D + n, mask=n < D, other=0.0, cache_modifier=".cg")
    if ADD:
        acc = acc.to(dt).to(tl.float32) + tl.load(add_ptr + t * D + n, mask=n < D, other=0.0).to(tl.float32)
    tl.store(y_ptr + t * D + n, acc.to(dt), mask=n < D)


def _down_split_kernel(h_ptr, w_ptr, s_ptr, ids_ptr, wt_ptr, add_ptr, y_ptr, p_ptr, tickets_ptr, D, first, n_local,
                       w_expert_stride, s_expert_stride, I: constexpr, S_STRIDE: constexpr, FP4: constexpr,
                       E8M0: constexpr, TOPK: constexpr, ADD: constexpr, BLOCK_N: constexpr, BLOCK_K: constexpr,
                       FUSED_SUM: constexpr):
    """_down_kernel with the experts of a token in parallel: grid (row blocks of D, T, TOPK); program (nb, t, j)
    stores expert j's rounded, weighted term into p [T, TOPK, D] (0 where another rank owns it), and the last
    of a (t, nb)'s TOPK programs (an int32 ticket) sums them in routing order (FUSED_SUM; else _down_sum_kernel
    in a second launch). At one token the down projection's experts no longer run one after another."""
    pdl_wait()
    nb = tl.program_id(0)
    t = tl.program_id(1).to(tl.int64)
    j = tl.program_id(2)
    n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    dt = y_ptr.dtype.element_ty
    r = t * TOPK + j
    e = tl.load(ids_ptr + r).to(tl.int64) - first
    term = tl.zeros([BLOCK_N], dtype=tl.float32)
    if (e >= 0) & (e < n_local):
        w, s = w_ptr + e * w_expert_stride, s_ptr + e * s_expert_stride
        if FP4:
            out = _fp4_rows([h_ptr + r * I], w, s, n, D, 0, I, I, S_STRIDE, E8M0, BLOCK_N, BLOCK_K)[0]
        else:
            out = _fp8_rows([h_ptr + r * I], w, s, n, D, 0, 0, I, I, S_STRIDE, E8M0, BLOCK_N, BLOCK_K)[0]
        weight = tl.load(wt_ptr + r).to(tl.float32)
        term = (out.to(dt).to(tl.float32) * weight).to(dt).to(tl.float32)
    tl.store(p_ptr + r * D + n, term, mask=n < D)
    if FUSED_SUM:
        tl.debug_barrier()  # every thread's term stored before the ticket's release
        ticket = tickets_ptr + t * tl.num_programs(0) + nb
        if tl.atomic_add(ticket, 1, sem="acq_rel", scope="gpu") == TOPK - 1:
            _down_sum_store(p_ptr, add_ptr, y_ptr, t, n, D, TOPK, ADD)
            tl.store(ticket, 0)


def _down_sum_kernel(p_ptr, add_ptr, y_ptr, D, TOPK: constexpr, ADD: constexpr, BLOCK: constexpr):
    """Grid (blocks of D, T): _down_split_kernel's terms summed without tickets."""
    pdl_wait()
    t = tl.program_id(1).to(tl.int64)
    _down_sum_store(p_ptr, add_ptr, y_ptr, t, tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), D, TOPK, ADD)


def _readable(w: QWeight) -> bool:
    if w.fmt not in ("fp8", "fp4") or w.scale is None or w.scale.dtype not in (torch.float8_e8m0fnu, torch.float32):
        return False
    if not (w.data.is_contiguous() and w.scale.is_contiguous()):
        return False
    if w.fmt == "fp4":
        return w.row0 == 0 and w.col0 == 0 and w.shape[1] % 8 == 0  # int32 words of 8 inputs
    return w.col0 % FP8_BLOCK == 0


def supported(x: torch.Tensor, stacks: list[QWeight], rows: int | None = None) -> bool:
    """Stacked [E, N, K] experts w1, w3, w2 of one format that the kernels read; x [T, D] of few rows
    (`rows`: the rows that count against MAX_ROWS, x's by default; 1 when every row must run alone)."""
    if x.dim() != 2 or not x.is_contiguous() or x.numel() == 0 or (x.shape[0] if rows is None else rows) > MAX_ROWS:
        return False
    w1, w3, w2 = stacks
    return (len({w.fmt for w in stacks}) == 1 and all(_readable(w) for w in stacks)
            and all(w.data.dim() == 3 for w in stacks) and w1.shape == w3.shape
            and w1.data.stride() == w3.data.stride() and w1.scale.stride() == w3.scale.stride())


def shared_supported(x: torch.Tensor, w1: QWeight, w3: QWeight, rows: int | None = None) -> bool:
    """The shared expert's gate/up ([I, D] each, this rank's rows) for kernel 1 (`rows` as in supported)."""
    if x.dim() != 2 or not x.is_contiguous() or x.numel() == 0 or (x.shape[0] if rows is None else rows) > MAX_ROWS:
        return False
    return (w1.fmt == w3.fmt and _readable(w1) and _readable(w3) and w1.data.dim() == 2 and w1.shape == w3.shape
            and w1.scale.shape == w3.scale.shape and w1.row0 == w3.row0)


def _options() -> dict:
    return {} if interpreting() else {"num_warps": CONFIG["num_warps"]}


def _block_k(w: QWeight) -> int:
    return CONFIG["block_k_fp4" if w.fmt == "fp4" else "block_k_fp8"]


def _geometry(x, w1: QWeight, topk: int, block_n: int, split_k: int) -> tuple[int, int, int, int, int, int]:
    """Kernel 1's (I, rows, block_k, k_chunk, splits, row blocks) for x and w1: the split is CONFIG's alone."""
    I, K, rows = w1.shape[0], x.shape[1], x.shape[0] * topk
    block_k = _block_k(w1)
    tiles = cdiv(K, block_k)
    k_chunk = cdiv(tiles, max(1, min(split_k, tiles))) * block_k
    return I, rows, block_k, k_chunk, cdiv(K, k_chunk), cdiv(I, block_n)


def _row_skew(w: QWeight) -> int:
    return w.row0 % FP8_BLOCK if w.fmt == "fp8" else 0


def _gate_up(x, w1: QWeight, w3: QWeight, ids, first: int, n_local: int, topk: int, limit: float, block_n: int,
             split_k: int, groups=None):
    if ids is not None and moe_gl.chosen_gate_up(x, w1, w3):
        return moe_gl.gate_up(x, ids, w1, w3, first, limit, groups)
    d1, s1 = _operands(w1, words=True)
    d3, s3 = _operands(w3, words=True)
    routed = ids is not None
    I, rows, block_k, k_chunk, splits, blocks = _geometry(x, w1, topk, block_n, split_k)
    h = torch.empty(rows, I, dtype=x.dtype, device=x.device)
    partials = h if splits == 1 else torch.empty(rows, splits, 2, I, dtype=torch.float32, device=x.device)
    # Without tickets (more than the pool, or a capture before any eager launch) the second launch sums: same bits.
    tickets = tickets_for(rows * blocks, x.device) if splits > 1 and CONFIG["fused_sum"] else None
    compact = routed and CONFIG["compact"]
    launcher(_gate_up_kernel, x)[(blocks, splits, rows)](
        x, d1, s1, d3, s3, ids if routed else s1, h, partials, tickets if tickets is not None else partials, rows, I,
        first, n_local, d1.stride(0) if routed else 0, s1.stride(0) if routed else 0, _row_skew(w1), float(limit),
        K=x.shape[1], S_STRIDE=s1.shape[-1], FP4=w1.fmt == "fp4", E8M0=s1.dtype == torch.uint8, TOPK=topk,
        ROUTED=routed, BLOCK_N=block_n, BLOCK_K=block_k, SPLITS=splits, K_CHUNK=k_chunk,
        FUSED_SUM=tickets is not None, COMPACT=compact, ROWS_P2=next_pow2(rows) if compact else 1,  # one build for any T
        PAIRED=CONFIG["gate_up_paired"], **_options())
    if splits > 1 and tickets is None:
        launcher(_gate_up_sum_kernel, x)[(cdiv(I, 1024), rows)](
            partials, ids if routed else s1, h, I, first, n_local, float(limit), ROUTED=routed, SPLITS=splits,
            BLOCK=1024)
    return h


def groups_for(x: torch.Tensor, ids: torch.Tensor, w1: QWeight, w3: QWeight) -> torch.Tensor | None:
    """The step's pairs grouped by expert for the Gluon kernels (dsv4.kernels.moe_gl.groups_for), or None: built once
    a layer, read by both kernels."""
    return moe_gl.groups_for(x, ids, w1, w3)


def routed_and_shared_gate_up(x: torch.Tensor, ids: torch.Tensor, w1: QWeight, w3: QWeight, first: int,
                              sw1: QWeight, sw3: QWeight, limit: float,
                              groups: torch.Tensor | None = None,
                              early: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(h [T * k, I] of the routed rows, h [T, SI] of the shared expert): kernel 1 for both in one launch
    (_gate_up_shared_kernel; CONFIG shared_launch), each row's bits those of its own launch. Without tickets for
    both (a capture before any eager launch, or too many rows) it is the two launches. groups: groups_for's. early:
    the caller's word that x was written two or more launches back (moe_gl.gate_up_shared)."""
    T, k = ids.shape
    n_local = w1.data.shape[0]
    ids = ids.contiguous()
    routed_args = (first, n_local, k, limit, CONFIG["gate_up_block_n"], CONFIG["gate_up_split_k"])
    shared_args = (0, 1, 1, limit, CONFIG["shared_block_n"], CONFIG["shared_split_k"])
    if moe_gl.chosen_gate_up(x, w1, w3):  # the Gluon kernels (DSV4_MOE_GLUON): the shared expert's in one launch
        if CONFIG["shared_launch"] and moe_gl.shared_fits(x, sw1, sw3):
            return moe_gl.gate_up_shared(x, ids, w1, w3, first, sw1, sw3, limit, groups, early)
        return _gate_up(x, w1, w3, ids, *routed_args, groups), _gate_up(x, sw1, sw3, None, *shared_args)
    I, rows, block_k, k_chunk, splits, blocks = _geometry(x, w1, k, CONFIG["gate_up_block_n"],
                                                          CONFIG["gate_up_split_k"])
    SI, _, s_block_k, s_k_chunk, s_splits, s_blocks = _geometry(x, sw1, 1, CONFIG["shared_block_n"],
                                                                CONFIG["shared_split_k"])
    tickets = tickets_for(rows * blocks + T * s_blocks, x.device) if CONFIG["fused_sum"] else None
    if tickets is None or not CONFIG["shared_launch"]:
        return _gate_up(x, w1, w3, ids, *routed_args), _gate_up(x, sw1, sw3, None, *shared_args)
    d1, s1 = _operands(w1, words=True)
    d3, s3 = _operands(w3, words=True)
    e1, t1 = _operands(sw1, words=True)
    e3, t3 = _operands(sw3, words=True)
    h = torch.empty(rows, I, dtype=x.dtype, device=x.device)
    sh = torch.empty(T, SI, dtype=x.dtype, device=x.device)
    partials = h if splits == 1 else torch.empty(rows, splits, 2, I, dtype=torch.float32, device=x.device)
    s_partials = sh if s_splits == 1 else torch.empty(T, s_splits, 2, SI, dtype=torch.float32, device=x.device)
    compact = CONFIG["compact"]
    launcher(_gate_up_shared_kernel, x)[(blocks * splits * rows + s_blocks * s_splits * T,)](
        x, d1, s1, d3, s3, ids, h, partials, e1, t1, e3, t3, sh, s_partials, tickets, rows, T, I, SI, first, n_local,
        d1.stride(0), s1.stride(0), _row_skew(w1), _row_skew(sw1), float(limit),
        K=x.shape[1], S_STRIDE=s1.shape[-1], FP4=w1.fmt == "fp4", E8M0=s1.dtype == torch.uint8, TOPK=k,
        BLOCK_N=CONFIG["gate_up_block_n"], BLOCK_K=block_k, SPLITS=splits, K_CHUNK=k_chunk, COMPACT=compact,
        ROWS_P2=next_pow2(rows) if compact else 1, PAIRED=CONFIG["gate_up_paired"], BLOCKS=blocks,
        SS_STRIDE=t1.shape[-1], S_FP4=sw1.fmt == "fp4", S_E8M0=t1.dtype == torch.uint8,
        S_BLOCK_N=CONFIG["shared_block_n"], S_BLOCK_K=s_block_k, S_SPLITS=s_splits, S_K_CHUNK=s_k_chunk,
        S_BLOCKS=s_blocks, **_options())
    return h, sh


def routed_gate_up(x: torch.Tensor, ids: torch.Tensor, w1: QWeight, w3: QWeight, first: int, limit: float,
                   groups: torch.Tensor | None = None) -> torch.Tensor:
    """Kernel 1 of the routed rows alone: h [T * k, I] (routed's, when it is not given h; groups: groups_for's)."""
    return _gate_up(x, w1, w3, ids.contiguous(), first, w1.data.shape[0], ids.shape[1], limit,
                    CONFIG["gate_up_block_n"], CONFIG["gate_up_split_k"], groups)


def routed(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, stacks: list[QWeight], first: int,
           limit: float, add: torch.Tensor | None = None, out: torch.Tensor | None = None,
           h: torch.Tensor | None = None, groups: torch.Tensor | None = None, early: bool = False,
           prefetch: bool = False) -> torch.Tensor:
    """x [T, D], ids [T, k] (global expert ids), weights [T, k] (x's dtype), stacks w1, w3 [n, I, D] and
    w2 [n, D, I] of experts first..first+n-1 -> [T, D]: sum over the local selected experts of weight * expert(x),
    plus `add` [T, D] (x's dtype) when given: in kernel 2 with CONFIG["shared_add"], else by torch. Kernel 2
    writes into out (contiguous [T, D], x's dtype) when given; the result is what is returned. h: kernel 1's
    output when it already ran (routed_and_shared_gate_up); groups: the table it ran with (groups_for), built here
    when h is not given. early: the caller's word that the given h was written two or more launches back
    (moe_gl.down's); prefetch: that the kernel before released kernel 2 first of all (moe_gl.down's)."""
    T, k = ids.shape
    w1, w3, w2 = stacks
    n_local = w1.data.shape[0]
    ids = ids.contiguous()
    if h is None:
        groups = groups_for(x, ids, w1, w3)
        h = routed_gate_up(x, ids, w1, w3, first, limit, groups)
    D, block_n = w2.shape[0], CONFIG["down_block_n"]
    y = _destination(out, T, D, x.dtype, x.device)
    fold = add is not None and CONFIG["shared_add"]
    if moe_gl.chosen_down(x, h, w2):
        terms = moe_gl.down(h, ids, weights.to(x.dtype), w2, first, add if fold else None, y, groups, early,
                            prefetch)
        if terms is not None:  # no tickets: the terms summed by a second launch
            launcher(_down_sum_kernel, x)[(cdiv(D, 1024), T)](terms, add if fold else y, y, D, TOPK=k, ADD=fold,
                                                              BLOCK=1024)
        return y if add is None or fold else y + add
    d2, s2 = _operands(w2, words=True)
    add_or_y = add.contiguous() if fold else y
    consts = dict(I=w2.shape[1], S_STRIDE=s2.shape[-1], FP4=w2.fmt == "fp4", E8M0=s2.dtype == torch.uint8, TOPK=k,
                  ADD=fold, BLOCK_N=block_n, BLOCK_K=_block_k(w2))
    # fp32 keeps kernel 2: there `acc += out * weight` compiles to a fused multiply-add, which a sum of stored
    # terms cannot repeat (bf16/fp16 round each term first, so the split sum has the same bits).
    # The split pays where a token's experts are the only parallelism (a few tokens), not at 16 (moe_bench, session 8
    # call 3: one Flash layer at 16 tokens 318 us paired alone, 333 with the split). Equal bits either way.
    if not CONFIG["down_split_experts"] or x.dtype == torch.float32 or T > CONFIG["down_split_tokens"]:
        launcher(_down_kernel, x)[(cdiv(D, block_n), T)](
            h, d2, s2, ids, weights.contiguous(), add_or_y, y, D, first, n_local, d2.stride(0), s2.stride(0),
            **consts, **_options())
        return y if add is None or fold else y + add
    terms = torch.empty(T, k, D, dtype=torch.float32, device=x.device)
    tickets = tickets_for(T * cdiv(D, block_n), x.device) if CONFIG["fused_sum"] else None
    launcher(_down_split_kernel, x)[(cdiv(D, block_n), T, k)](
        h, d2, s2, ids, weights.contiguous(), add_or_y, y, terms, terms if tickets is None else tickets, D, first,
        n_local, d2.stride(0), s2.stride(0), **consts, FUSED_SUM=tickets is not None, **_options())
    if tickets is None:
        launcher(_down_sum_kernel, x)[(cdiv(D, 1024), T)](terms, add_or_y, y, D, TOPK=k, ADD=fold, BLOCK=1024)
    return y if add is None or fold else y + add


def shared_gate_up(x: torch.Tensor, w1: QWeight, w3: QWeight, limit: float) -> torch.Tensor:
    """x [T, D] -> the shared expert's activation [T, I] (its w2 stays a linear)."""
    return _gate_up(x, w1, w3, None, 0, 1, 1, limit, CONFIG["shared_block_n"], CONFIG["shared_split_k"])
