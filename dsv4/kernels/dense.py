"""Decode GEMV on a dense weight (reference: F.linear(x, W), row by row under rows_alone).

In the official checkpoint the compressors' wkv/wgate, the indexer's weights_proj and its compressor,
the router gate and the head are bf16, and mHC's mix multiplies by the fp32 hc_fn. cuBLAS picks its
GEMM kernel (and so each row's sum order) by the number of rows, so a batched decode step ran these
row by row (dsv4.model.rows): one launch per row and per weight. Here one launch computes every row,
each on its own: program (row group, N block, K split) sums BLOCK_N outputs of each row over one K chunk in
fp32, and the K split depends on (N, K) alone; with several splits, fp32 partials are added in
ascending split order by a second launch (qgemv's split sum) or, with CONFIG["fused_sum"], by the last
program of the (row group, N block) to finish (qgemv's ticket reduce; the same bits, deterministic, no float
atomics). A row's bits therefore do not depend on how many rows share the launch.

A program computes up to CONFIG["rows"] rows (program_rows): it loads each weight tile once and applies it
to each row in turn with that row's own operations (the ones a program of that row alone runs, on the same
tile layout), so the bits stay the row's own. Row groups are the fastest grid axis: the programs of all
groups that read one weight tile are launched together, so the tile comes from HBM once and from L2 for the
other groups.

W [N, K] bf16 or fp32, x [..., K] bf16 or fp32; the output has x's dtype (fp32 in, fp32 out).

CONFIG["kernel"] "v3" (DSV4_DENSE_GEMV=v3, or `--gemv v3`: off by default, slower for one row; session 7 on an H200,
a flash step's dense products: 1 row 1,215 -> 1,399 us, 16 rows 4,589 -> 2,231 us) runs bf16 x on bf16 weights on the
tensor cores, as qgemv's v3: a program computes a [16 rows, BLOCK_N] tile with tl.dot over K tiles of a fixed size,
the x rows padded to 16 with zeros, the split from (N, K) alone and summed as above; each output element comes from
its own row and column in an order fixed by the instruction and the K loop, so a row's bits do not depend on the
other rows of its tile. Other dtypes keep the kernel above (an fp32 dot runs on the CUDA cores anyway).
"""

import os

import torch

from . import cdiv, device_function, interpreting, launcher, next_pow2, pdl_wait
from . import qgemv
from .qgemv import BLOCK_M, _destination, _dot, _group_rows, _reduce_splits, _reduce_tile, rows_per_program

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # session 5: its CUDA tests and test_replay_gpu under DSV4_KERNELS=triton; benchmarks/dense_bench.py

MAX_ROWS = 8  # outside rows_alone (prefill), more rows than this per weight take cuBLAS's GEMM
DTYPES = (torch.bfloat16, torch.float32)
# Launch configuration (benchmarks/dense_bench.py sweeps it): outputs per program, the K tile in bytes
# of weight per output row (bf16: 512 inputs, fp32: 256: 16-byte loads either way), warps, and the
# K split: doubled from 1 while the launch has fewer than "programs" programs per row (0), or fixed;
# "fused_sum": the splits summed in the same launch (qgemv's v2_fused_sum, set by the same DSV4_FUSED_SPLIT_SUM);
# "rows": at most this many rows in one program, which reads each weight tile once for all of them (1: a program
# per row), fewer where their accumulators would pass "acc_regs" registers per thread (program_rows).
# "kernel": "v3" for the tensor-core tiles (bf16 x and weight), with outputs per program "v3_block_n", inputs per
# dot "v3_block_k" and "v3_num_warps"; split-K by "split_k" and "programs" as above, summed as above.
# "shape_tiles" (DSV4_DENSE_SHAPE_TILES=0 turns it off, read at import): a weight of at least "head_bytes" (the
# head's vocabulary slice, 0.5-1 GB at Flash's widths) takes K tiles of "head_block_k_bytes": session 20 call 1
# (benchmarks/dense_bench.py --world 1, the head [129280, 4096] bf16 at one row): 244.4 us with 1,024-byte tiles,
# 230.8 with 512 (270.8 at 32 rows a program, 301.0 with 2,048-byte tiles). The tiles depend on the weight alone,
# so a row's bits are the same whatever the batch (they are not the 1,024-byte tiles' bits).
CONFIG = {"block_n": 16, "block_k_bytes": 1024, "num_warps": 4, "split_k": 0, "programs": 264,
          "fused_sum": qgemv.CONFIG["v2_fused_sum"], "rows": qgemv.CONFIG["v2_rows"],
          "acc_regs": 128, "kernel": os.environ.get("DSV4_DENSE_GEMV", "v2"), "v3_block_n": 32, "v3_block_k": 256,
          "v3_num_warps": 4, "shape_tiles": os.environ.get("DSV4_DENSE_SHAPE_TILES", "1") == "1",
          "head_bytes": 256 << 20, "head_block_k_bytes": 512}


@device_function
def _dense_tile(w_rows, kk, n_ok, K: constexpr, EVEN_K: constexpr):
    """_dense_kernel's weight tile at inputs kk, in the weight's dtype."""
    if EVEN_K:
        return tl.load(w_rows + kk[None, :], mask=n_ok[:, None], other=0.0)
    return tl.load(w_rows + kk[None, :], mask=n_ok[:, None] & (kk < K)[None, :], other=0.0)


def _dense_kernel(x_ptr, w_ptr, y_ptr, p_ptr, tickets_ptr, N, rows, x_stride, K: constexpr, BLOCK_N: constexpr,
                  BLOCK_K: constexpr, SPLITS: constexpr, K_CHUNK: constexpr, EVEN_K: constexpr, FUSED_SUM: constexpr,
                  ROWS: constexpr, EARLY: constexpr):
    """Grid (row groups, N blocks, SPLITS): a program reads its weight tile once for the ROWS rows of its group (the
    last group's missing rows repeat its last row). SPLITS > 1: fp32 partials [rows, SPLITS, N] at p_ptr, summed into
    y_ptr by the last program of the (row group, N block) (FUSED_SUM) or by qgemv's _sum_splits_kernel after this
    launch. EARLY (a stored weight; launched with launch_pdl under DSV4_PDL): the first weight tile is loaded before
    the loop and pdl_wait runs while it is in flight, before x is read; tiles stay in the weight's dtype until they
    are used. The sums are the same either way."""
    if not EARLY:
        pdl_wait()
    rs = _group_rows(tl.program_id(0), rows, ROWS)
    nb = tl.program_id(1)
    split = tl.program_id(2)
    n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    totals = _dense_totals(x_ptr, w_ptr, rs, n, n_ok, split, x_stride, K, BLOCK_N, BLOCK_K, K_CHUNK, EVEN_K, ROWS,
                           EARLY)
    if SPLITS == 1:
        for i in tl.static_range(ROWS):
            tl.store(y_ptr + rs[i] * N + n, totals[i].to(y_ptr.dtype.element_ty), mask=n_ok)
    elif FUSED_SUM:
        ticket = tickets_ptr + tl.program_id(0) * tl.num_programs(1) + nb
        _reduce_splits(totals, tl.program_id(0), rows, p_ptr, y_ptr, ticket, split, n, N, SPLITS)
    else:
        for i in tl.static_range(ROWS):
            tl.store(p_ptr + (rs[i] * SPLITS + split) * N + n, totals[i], mask=n_ok)


@device_function
def _dense_totals(x_ptr, w_ptr, rs, n, n_ok, split, x_stride, K: constexpr, BLOCK_N: constexpr, BLOCK_K: constexpr,
                  K_CHUNK: constexpr, EVEN_K: constexpr, ROWS: constexpr, EARLY: constexpr):
    """_dense_kernel's sums: each of the group's rows rs over outputs n and inputs split's K chunk, fp32 (a tuple, a
    row each). EARLY: the first weight tile loaded, then pdl_wait, then x (the caller waited already otherwise)."""
    w_rows = w_ptr + n.to(tl.int64)[:, None] * K
    xs = [x_ptr + r * x_stride for r in rs]
    k = split * K_CHUNK + tl.arange(0, BLOCK_K)
    # Products add into a [BLOCK_N, BLOCK_K] tile per row, reduced across lanes once at the end (fewer shuffles
    # per byte); each row's tile gets the operations it gets alone.
    accs = (tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32),) * ROWS
    if EARLY:
        wq = _dense_tile(w_rows, k, n_ok, K, EVEN_K)
        pdl_wait()
    for k0 in range(0, K_CHUNK, BLOCK_K):
        kk = k + k0
        if not EARLY:
            wq = _dense_tile(w_rows, kk, n_ok, K, EVEN_K)
        elif k0 > 0:
            wq = _dense_tile(w_rows, kk, n_ok, K, EVEN_K)
        wv = wq.to(tl.float32)
        summed = ()
        for i in tl.static_range(ROWS):
            if EVEN_K:
                xv = tl.load(xs[i] + kk)
            else:
                xv = tl.load(xs[i] + kk, mask=kk < K, other=0.0)
            summed = summed + (accs[i] + wv * xv.to(tl.float32)[None, :],)
        accs = summed
    totals = ()
    for i in tl.static_range(ROWS):
        totals = totals + (tl.sum(accs[i], axis=1),)
    return totals


@device_function
def _dense3_dot(acc, x_rows, m_ok, wv, kk, K: constexpr, IEEE: constexpr):
    """acc plus x's rows at inputs kk times the weight tile wv [BLOCK_N, inputs kk], one dot."""
    xv = tl.load(x_rows + kk[None, :], mask=m_ok[:, None] & (kk < K)[None, :], other=0.0)
    return _dot(xv, tl.trans(wv), acc, IEEE)


def _dense3_kernel(x_ptr, w_ptr, y_ptr, p_ptr, tickets_ptr, N, rows, x_stride, K: constexpr, BLOCK_M: constexpr,
                   BLOCK_N: constexpr, BLOCK_K: constexpr, SPLITS: constexpr, K_CHUNK: constexpr,
                   FUSED_SUM: constexpr, IEEE: constexpr, EARLY: constexpr):
    """Grid (N blocks, SPLITS, row tiles of BLOCK_M): y[m, n] over inputs [split * K_CHUNK, +K_CHUNK) by tl.dot.
    SPLITS > 1: fp32 partials [rows, SPLITS, N] at p_ptr, summed into y_ptr as qgemv's _qgemv3_kernel does. The
    first K tile of the weight is loaded before the K loop, which goes on from the second (the same dots in the
    same order); EARLY (a stored weight; launched with launch_pdl under DSV4_PDL): pdl_wait runs while it is in
    flight, before x is read."""
    if not EARLY:
        pdl_wait()
    nb = tl.program_id(0)
    split = tl.program_id(1)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = m < rows
    n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    x_rows = x_ptr + m.to(tl.int64)[:, None] * x_stride
    w_rows = w_ptr + n.to(tl.int64)[:, None] * K
    k = split * K_CHUNK + tl.arange(0, BLOCK_K)
    wv = tl.load(w_rows + k[None, :], mask=n_ok[:, None] & (k < K)[None, :], other=0.0)
    if EARLY:
        pdl_wait()
    acc = _dense3_dot(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), x_rows, m_ok, wv, k, K, IEEE)
    for k0 in range(BLOCK_K, K_CHUNK, BLOCK_K):
        kk = k + k0
        wv = tl.load(w_rows + kk[None, :], mask=n_ok[:, None] & (kk < K)[None, :], other=0.0)
        acc = _dense3_dot(acc, x_rows, m_ok, wv, kk, K, IEEE)
    if SPLITS == 1:
        tl.store(y_ptr + m.to(tl.int64)[:, None] * N + n[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=m_ok[:, None] & n_ok[None, :])
    elif FUSED_SUM:
        ticket = tickets_ptr + tl.program_id(2) * tl.num_programs(0) + nb
        _reduce_tile(acc, m, rows, p_ptr, y_ptr, ticket, split, n, N, SPLITS)
    else:
        tl.store(p_ptr + (m.to(tl.int64)[:, None] * SPLITS + split) * N + n[None, :], acc,
                 mask=m_ok[:, None] & n_ok[None, :])


def supported(x: torch.Tensor, weight: torch.Tensor, rows: int) -> bool:
    """Whether the kernel computes F.linear(x, weight) for `rows` rows per weight (rows_per_weight)."""
    return (x.dtype in DTYPES and weight.dtype in DTYPES and weight.dim() == 2 and weight.is_contiguous()
            and x.dim() >= 1 and x.shape[-1] == weight.shape[1] and x.numel() > 0 and weight.numel() > 0
            and x.device == weight.device and rows <= MAX_ROWS)


def tiling(N: int, K: int, weight_dtype: torch.dtype) -> tuple[int, int, int]:
    """(BLOCK_K, K_CHUNK, SPLITS) for a weight [N, K]: from the weight alone, never from the rows, so
    each row is summed in one order whatever the batch."""
    itemsize = torch.empty((), dtype=weight_dtype).element_size()
    tile_bytes = CONFIG["block_k_bytes"]
    if CONFIG["shape_tiles"] and N * K * itemsize >= CONFIG["head_bytes"]:
        tile_bytes = CONFIG["head_block_k_bytes"]
    return _split(N, K, CONFIG["block_n"], min(tile_bytes // itemsize, next_pow2(K)))


def tiling3(N: int, K: int) -> tuple[int, int, int]:
    """tiling for v3 (tl.dot takes at least 16 inputs)."""
    return _split(N, K, CONFIG["v3_block_n"], min(CONFIG["v3_block_k"], max(16, next_pow2(K))))


def uses_v3(x: torch.Tensor, weight: torch.Tensor, kernel: str | None = None) -> bool:
    return (kernel or CONFIG["kernel"]) == "v3" and x.dtype == weight.dtype == torch.bfloat16


def _split(N: int, K: int, block_n: int, block_k: int) -> tuple[int, int, int]:
    tiles = cdiv(K, block_k)
    splits = CONFIG["split_k"]
    if not splits:
        splits, programs = 1, cdiv(N, block_n)
        while programs * splits < CONFIG["programs"] and splits * 2 <= tiles:
            splits *= 2
    k_chunk = cdiv(tiles, min(splits, tiles)) * block_k
    return block_k, k_chunk, cdiv(K, k_chunk)  # no split left without inputs


def program_rows(rows: int, block_k: int, k_chunk: int) -> int:
    """Rows per program: up to CONFIG["rows"]; where a program's K chunk spans several tiles (each row's
    [BLOCK_N, BLOCK_K] fp32 tile then lives across them), only as many as hold their tiles in CONFIG["acc_regs"]
    registers per thread (sm_90 compiles: Flash's head slice, 8 tiles of [16, 512], at 2 rows 241 registers
    and no spill, at 4 rows 680 bytes of spills, at 8 rows 9 KB). A row's bits do not depend on it."""
    cap = CONFIG["rows"]
    if k_chunk > block_k:
        per_row = CONFIG["block_n"] * block_k // (32 * CONFIG["num_warps"])
        cap = min(cap, 1 << (max(1, CONFIG["acc_regs"] // per_row).bit_length() - 1))
    return rows_per_program(rows, cap)


def widens(x: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether linear(..., dtype=dtype) computes F.linear(x.to(dtype), weight) with v2's kernel: an fp32 weight and
    output (the products of x's values widened as loaded are those of x.to(fp32)'s)."""
    return dtype == torch.float32 and weight.dtype == torch.float32 and x.dtype in DTYPES


def linear(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None,
           stored: bool = False, kernel: str | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [..., K] @ weight[N, K]^T -> [..., N] in x's dtype, written into out (contiguous, rows x N) when given.
    stored: weight is a model parameter, which no step writes (not a copy converted in this step): with DSV4_PDL the
    launch then reads its first tile before it waits for the kernel before it. kernel: "v2" or "v3" for this call
    (dsv4.model.rows.step_gemv), CONFIG's when None. dtype (widens): the output's dtype, x read in its own and
    widened as loaded (x.to(dtype) @ weight^T without the conversion's launch)."""
    N, K = weight.shape
    x2 = x.reshape(-1, K).contiguous()
    rows = x2.shape[0]
    if dtype is not None and not widens(x2, weight, dtype):
        raise ValueError(f"dense.linear: dtype {dtype} for x {x.dtype} and weight {weight.dtype}: only an fp32 weight "
                         "widens x into an fp32 output")
    y = _destination(out, rows, N, dtype or x.dtype, x.device)
    if dtype is None and uses_v3(x2, weight, kernel):
        return _linear3(x2, weight, y, stored).view(*x.shape[:-1], N)
    block_k, k_chunk, splits = tiling(N, K, weight.dtype)
    block_n = CONFIG["block_n"]
    blocks = cdiv(N, block_n)
    per_program = program_rows(rows, block_k, k_chunk)
    groups = cdiv(rows, per_program)
    partials = y if splits == 1 else torch.empty(rows, splits, N, dtype=torch.float32, device=x.device)
    tickets = qgemv.tickets_for(groups * blocks, x.device) if splits > 1 and CONFIG["fused_sum"] else None
    extra = {} if interpreting() else {"num_warps": CONFIG["num_warps"]}
    launcher(_dense_kernel, x2)[(groups, blocks, splits)](
        x2, weight, y, partials, tickets if tickets is not None else partials, N, rows, x2.stride(0), K=K,
        BLOCK_N=block_n, BLOCK_K=block_k, SPLITS=splits, K_CHUNK=k_chunk, EVEN_K=K % k_chunk == 0,
        FUSED_SUM=tickets is not None, ROWS=per_program, EARLY=stored, **extra)
    if splits > 1 and tickets is None:
        qgemv.sum_splits(partials, y, rows)
    return y.view(*x.shape[:-1], N)


def _linear3(x2: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, stored: bool) -> torch.Tensor:
    (N, K), rows = weight.shape, x2.shape[0]
    block_k, k_chunk, splits = tiling3(N, K)
    block_n = CONFIG["v3_block_n"]
    blocks, row_tiles = cdiv(N, block_n), cdiv(rows, BLOCK_M)
    partials = y if splits == 1 else torch.empty(rows, splits, N, dtype=torch.float32, device=x2.device)
    tickets = qgemv.tickets_for(row_tiles * blocks, x2.device) if splits > 1 and CONFIG["fused_sum"] else None
    extra = {} if interpreting() else {"num_warps": CONFIG["v3_num_warps"]}
    launcher(_dense3_kernel, x2)[(blocks, splits, row_tiles)](
        x2, weight, y, partials, tickets if tickets is not None else partials, N, rows, x2.stride(0), K=K,
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k, SPLITS=splits, K_CHUNK=k_chunk,
        FUSED_SUM=tickets is not None, IEEE=interpreting(), EARLY=stored, **extra)
    if splits > 1 and tickets is None:
        qgemv.sum_splits(partials, y, rows)
    return y
