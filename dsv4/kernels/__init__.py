"""Fused Triton kernels for the decode path; each has its torch reference in dsv4.model.

Decode on a GPU is bound by how many kernels a token launches (mHC's 20 Sinkhorn
iterations alone are ~120 tiny kernels per sublayer). These kernels fuse such
chains into one launch. They are one implementation choice of the one forward:
eager and graph replay run the same kernels, so they stay bit-identical to each
other; against the torch reference they agree to float rounding (tests state
the tolerance).

Policy, `DSV4_KERNELS`:
- "auto" (default): Triton for CUDA tensors when triton imports, torch otherwise
  (a kernel not yet checked on a GPU stays on its reference: see enabled);
- "torch": always the torch reference (the benchmark's reference arm);
- "triton": always Triton; CPU tensors run through Triton's interpreter
  (TRITON_INTERPRET=1 from the start of the process: the tests' conftest sets it).
"""

from __future__ import annotations

import functools
import os

import torch

MODES = ("auto", "torch", "triton")


def mode() -> str:
    m = os.environ.get("DSV4_KERNELS", "auto")
    if m not in MODES:
        raise ValueError(f"DSV4_KERNELS={m!r}: allowed {list(MODES)}")
    return m


@functools.cache
def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def enabled(kernel, t: torch.Tensor) -> bool:
    """Whether the model runs `kernel` (a module of dsv4.kernels) on t, by DSV4_KERNELS and the
    module's own `GPU_CHECKED`: promoting a kernel is that one line in its file."""
    return use_triton(t, gpu_checked=kernel.GPU_CHECKED)


GEMVS = ("v2", "v3")


def gemv() -> str:
    """The decode GEMVs' kernel family (qgemv's and dense's CONFIG["kernel"]; see select_gemv)."""
    from . import dense, qgemv

    return qgemv.CONFIG["kernel"] if qgemv.CONFIG["kernel"] == dense.CONFIG["kernel"] else \
        f"qgemv {qgemv.CONFIG['kernel']}, dense {dense.CONFIG['kernel']}"


def select_gemv(name: str) -> None:
    """The decode GEMVs' kernels for this process and the ranks it spawns after this call (they read
    DSV4_QGEMV / DSV4_DENSE_GEMV at import): "v2", one row per program's own multiply-adds (fastest for one
    sequence), or "v3", tensor-core tiles of 16 rows (a batched step's GEMVs ~4x faster at 16 rows, a lone row
    ~25 % slower: benchmarks/RESULTS.md, session 7). Either way a row's bits do not depend on the batch, but v2
    and v3 give a row different bits: a model's outputs are comparable within one choice."""
    from . import dense, qgemv

    if name not in GEMVS:
        raise ValueError(f"gemv {name!r}: allowed {list(GEMVS)}")
    qgemv.CONFIG["kernel"] = dense.CONFIG["kernel"] = name
    os.environ["DSV4_QGEMV"] = os.environ["DSV4_DENSE_GEMV"] = name


def use_triton(t: torch.Tensor, gpu_checked: bool = True) -> bool:
    """gpu_checked=False marks a kernel not yet through the GPU checks (its CUDA tests, the replay
    identity, the gate: benchmarks/gpu_checks.sh): "auto" keeps the torch reference for it, and
    only DSV4_KERNELS=triton runs it. A kernel module declares it as GPU_CHECKED (see enabled)."""
    m = mode()
    if m == "torch":
        return False
    if m == "triton":
        if not _triton_available():
            raise RuntimeError("DSV4_KERNELS=triton but triton does not import")
        return True
    return gpu_checked and t.is_cuda and _triton_available()


_compiled: dict = {}


def interpreting() -> bool:
    """Triton's interpreter runs kernels on CPU tensors; it must be chosen (TRITON_INTERPRET=1)
    before triton is first imported, because triton.language's own helpers are built then."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def launcher(fn, t: torch.Tensor):
    """The Triton kernel for the plain function `fn` (compiled once, or interpreted on CPU)."""
    if not t.is_cuda and not interpreting():
        raise RuntimeError(f"{fn.__name__}: a CPU tensor needs Triton's interpreter; set TRITON_INTERPRET=1 "
                           "before starting Python, or DSV4_KERNELS=auto|torch")
    k = _compiled.get(fn)
    if k is None:
        import triton

        if interpreting():
            _round_like_the_gpu()

        k = _compiled[fn] = triton.jit(fn)
    return k


def _round_like_the_gpu():
    """Triton's interpreter converts fp32 to bf16 by truncation; the GPU (and torch) round to
    nearest even. Make the interpreter round as the GPU does, so CPU tests check GPU numerics."""
    import numpy as np
    from triton.runtime import interpreter

    if getattr(interpreter, "_dsv4_rtne", False):
        return
    convert = interpreter._convert_float

    def convert_rtne(data, src, dst, rounding_mode):
        if src.primitive_bitwidth == 32 and dst.is_bf16() and rounding_mode is None:
            bits = np.frombuffer(np.ascontiguousarray(data).tobytes(), dtype=np.uint32).astype(np.uint64)
            nan = (bits & 0x7FFFFFFF) > 0x7F800000
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            rounded[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)  # quiet NaN stays NaN
            return rounded.reshape(np.shape(data))
        return convert(data, src, dst, rounding_mode)

    interpreter._convert_float = convert_rtne
    interpreter._dsv4_rtne = True


def cdiv(a: int, b: int) -> int:
    """Programs needed to cover a items b at a time."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def row_stride(x: torch.Tensor) -> int | None:
    """Elements from one row of x [rows, ...] to the next where each row is contiguous (x itself, or a column slice
    such as one part of a stacked linear's output), else None. A contiguous x's is its row's size whatever the
    strides of its size-1 axes, so a kernel taking it as a constexpr compiles once for contiguous inputs."""
    if x.dim() < 2 or x.numel() == 0 or not x[0].is_contiguous():
        return None
    return x[0].numel() if x.is_contiguous() else x.stride(0)


def device_function(fn):
    """A helper called from kernels: on the GPU it must be a Triton function itself (the compiler refuses
    plain Python callees, which the interpreter accepts), so it is jitted when triton imports."""
    try:
        import triton
    except ImportError:  # the torch reference runs without triton; the kernels are never built then
        return fn
    return triton.jit(fn)
