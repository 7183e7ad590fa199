"""The commit of one staged write in one kernel (reference: dsv4.model.commit.commit): `buf[index[i]] = rows[i]` for each row i whose
`keep[i]` holds, when the step's verdict is 0. Rows that do not hold are not written at all
(the reference writes their old values back); a step's kept rows have distinct indices. Each row of `rows` is
contiguous, the rows rows.stride(0) apart (a column view of a wider output is read in place: dsv4.layout fuse_xproj).
"""

import torch

from . import cdiv, launcher, next_pow2, pdl_wait, row_stride

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # through benchmarks/gpu_checks.sh: "auto" runs it on CUDA (dsv4.kernels.enabled)


def _commit_kernel(buf_ptr, index_ptr, rows_ptr, keep_ptr, verdict_ptr, rows_stride, ROW: constexpr,
                   HAS_KEEP: constexpr, BLOCK: constexpr):
    pdl_wait()
    i = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = (tl.load(verdict_ptr) == 0).to(tl.int32)
    if HAS_KEEP:
        ok = ok * (tl.load(keep_ptr + i) != 0).to(tl.int32)
    dst = tl.load(index_ptr + i).to(tl.int64)
    m = c < ROW * ok  # nothing of this row is written unless the step commits and keep holds
    v = tl.load(rows_ptr + i * rows_stride + c, mask=m, other=0.0)
    tl.store(buf_ptr + dst * ROW + c, v.to(buf_ptr.dtype.element_ty), mask=m)


def supported(buf: torch.Tensor, index: torch.Tensor, rows: torch.Tensor) -> bool:
    return (buf.is_contiguous() and rows.shape[0] > 0 and row_stride(rows) is not None and index.is_contiguous()
            and rows.shape[1:] == buf.shape[1:] and buf.dtype.is_floating_point and rows.dtype.is_floating_point)


def commit(buf, index, rows, keep, verdict) -> None:
    n, row = rows.shape[0], rows[0].numel()
    block = min(1024, next_pow2(row))
    launcher(_commit_kernel, buf)[(n, cdiv(row, block))](
        buf, index, rows, keep.view(torch.uint8) if keep is not None else index, verdict, row_stride(rows), ROW=row,
        HAS_KEEP=keep is not None, BLOCK=block)
