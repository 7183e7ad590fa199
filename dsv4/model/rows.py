"""Rows alone: a decode step computes every row as that row would be computed alone.

A batched decode step holds one token of each of several sequences. For a sequence's tokens not to
depend on who shares its step (batched == solo, bit for bit), every row-wise operation must give
a row the bits it gives that row alone. The fused kernels do by construction (one program per row,
a reduction order that depends on the weight alone). The torch reference does not promise it: a
GEMM takes another kernel for one row than for several; ATen's CPU elementwise loops compute a
tensor's last elements with scalar math and the rest with SIMD (so a row's transcendentals depend
on where the row sits); a CUDA reduction's split depends on how many outputs it has. So under
`rows_alone` the reference runs row by row (`dense`, `per_row`); where it runs, `dense` takes a GEMV
kernel that computes every row on its own in one launch instead (dsv4.kernels.dense). The forward
turns rows_alone on for every step of one token per sequence, a solo step included, so solo and
batched take the same path, and for every short prefill chunk (`short_chunk`: at most
prefill_pair_tokens tokens per sequence) alike: several prompts' chunks of one length then prefill in
one forward (Model.prefill_batch), each row as it would be in its chunk alone. What stays per
sequence (attention, the compressors, the indexer, the step's geometry) runs on that sequence's rows
alone, with shapes from its own T and position. Longer chunks keep the GEMMs: faster, batch-dependent.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

import torch
import torch.nn.functional as F

from .. import kernels
from ..kernels import dense as dense_kernel
from ..kernels import moe as fused_moe
from ..layout import CONFIG as layout_config

_ROWS_ALONE = contextvars.ContextVar("dsv4_rows_alone", default=False)
_TOKENS = contextvars.ContextVar("dsv4_tokens_per_sequence", default=1)


@contextlib.contextmanager
def rows_alone(on: bool = True, tokens: int = 1):
    """Within: every product over rows gives each row what it gives that row alone; the step holds `tokens`
    tokens of each sequence (1: a decode step; more: a prefill chunk), which a kernel choice may follow (the
    choice then depends on the step's kind, never on the sequences in it)."""
    token, count = _ROWS_ALONE.set(on), _TOKENS.set(tokens)
    try:
        yield
    finally:
        _ROWS_ALONE.reset(token)
        _TOKENS.reset(count)


def tokens_per_sequence() -> int:
    """The tokens of each sequence in the step being computed (rows_alone's `tokens`)."""
    return _TOKENS.get()


# dsv4.layout's prefill_gemv (DSV4_PREFILL_GEMV; "v3" by default, "" the process's, qgemv's and dense's CONFIG
# "kernel"): the GEMV family of a short prefill chunk's rows (rows alone, more than one token a sequence; a decode
# step keeps the process's). "v3", the tensor-core tiles, computes each row as alone as v2 does (a row's bits never
# depend on the batch), on the tensor cores: session 20 calls 4-5 (benchmarks/eager_host_profile.py --prefill 64,
# mini, one H200): the FP8 GEMVs of a 64-token prefill 14.6 ms on v2 (63 rows a weight), 1.4 ms on v3; the prefill
# 33.3 -> 19.0 ms of device time. A prompt's tokens then take other bits than with v2 (the tolerances to single
# decode steps hold either way); the chunks of one length still take one kernel, alone or grouped.
if layout_config["prefill_gemv"] not in ("", *kernels.GEMVS):
    raise ValueError(f"DSV4_PREFILL_GEMV={layout_config['prefill_gemv']!r}: allowed '' (the process's) or one of "
                     f"{list(kernels.GEMVS)}")


def step_gemv() -> str | None:
    """The GEMV family for the rows being computed: prefill_gemv inside a short prefill chunk (rows alone, more
    than one token a sequence) where it is set, else None (the process's choice). By the step's kind alone."""
    return (layout_config["prefill_gemv"] or None) if _ROWS_ALONE.get() and _TOKENS.get() > 1 else None


def short_chunk(T: int) -> bool:
    """Whether a step of T tokens per sequence computes each row alone (rows_alone): decode steps and prefill
    chunks up to the MoE pair kernels' limit (dsv4.kernels.moe CONFIG prefill_pair_tokens). By T alone, never
    by the number of sequences, so a chunk takes the same path alone and among others."""
    return T <= fused_moe.CONFIG["prefill_pair_tokens"]


def rows_per_weight(x: torch.Tensor) -> int:
    """The rows a kernel's row limit counts: x's, or 1 under rows_alone (the kernel choice must not
    depend on the batch, and the fused kernels compute each row on its own anyway)."""
    return 1 if _ROWS_ALONE.get() else x.numel() // x.shape[-1]


def per_row(*sliced: int):
    """Decorator for a row-wise torch reference f(x, ...): under rows_alone, with several rows, run
    it on each row alone and stack the results (a tensor or a tuple of tensors, row-major). The
    positional arguments numbered in `sliced` (besides x) are per-row too and are sliced alike."""

    def wrap(fn):
        @functools.wraps(fn)
        def run(x, *args, **kwargs):
            n = x.shape[0]
            if not _ROWS_ALONE.get() or n < 2:
                return fn(x, *args, **kwargs)
            outs = []
            for r in range(n):
                row = [a[r:r + 1] if i + 1 in sliced else a for i, a in enumerate(args)]
                outs.append(fn(x[r:r + 1], *row, **kwargs))
            if isinstance(outs[0], tuple):
                return tuple(torch.cat(parts) for parts in zip(*outs))
            return torch.cat(outs)
        return run
    return wrap


def dense(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None, source=None,
          dtype: torch.dtype | None = None) -> torch.Tensor:
    """F.linear(x, weight) (x [rows, K]): the dense GEMV kernel where it runs (every row on its own in
    one launch, written into out when given), else cuBLAS, row by row under rows_alone. source: the model's
    parameter that weight was taken from (weight is it unless this step converted a copy; dense_kernel.linear's
    stored). dtype (fp32, with an fp32 weight): F.linear(x.to(dtype), weight), x widened by the kernel as it loads
    it (no conversion launch)."""
    if kernels.use_triton(x, gpu_checked=dense_kernel.GPU_CHECKED) and dense_kernel.supported(
            x, weight, rows_per_weight(x)) and (dtype is None or dense_kernel.widens(x, weight, dtype)):
        return dense_kernel.linear(x, weight, out, stored=weight is source, kernel=step_gemv(),
                                   **({} if dtype is None else {"dtype": dtype}))
    return _dense_rows(x if dtype is None else x.to(dtype), weight)


@per_row()
def _dense_rows(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.linear(x, weight)
