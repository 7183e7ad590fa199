import os

# One pytest-xdist worker per core (the README's `-n 2` on CI's 2 cores): each worker's torch on one thread, and the
# ranks and servers it spawns too (they inherit the variable), so the workers do not fight over the cores. Set before
# torch starts its thread pool; a run without xdist keeps torch's default.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Triton's interpreter runs the fused kernels on CPU tensors (tests/test_kernels.py). It has to be
# chosen before triton is first imported; on a GPU machine the kernels compile for the device instead.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# What the two patches below replaced: (owner, attribute) -> Triton's own. A rank that dsv4.load(ranks=N) spawns runs
# Triton's own interpreter (this file is the pytest process's), whose tl.dot sums in float32 where _dot_rows_alone's
# sums in float64: a test comparing the ranks' bytes runs its own rank on Triton's own too (the stock_interpreter
# fixture).
_STOCK: dict = {}


def _device_calls_patch_once():
    """Triton 3.6's interpreter patches triton.language's modules for a launch (GridExecutor, restored after it) and
    again on every call of a device function (a @triton.jit function a kernel calls, tl.zeros included), never
    restored: within a launch, a module once patched stays patched with the same builder (TritonSemantic holds
    nothing else), so a call's patch of modules the launch already patched changes nothing but costs up to a third
    of an interpreted kernel's time (qgemv's and moe's, which call helpers in their loops). Those calls skip it; a
    call reaching a module not yet patched in this launch (tl.core, from tl.zeros) patches as before. Another
    Triton version keeps its own behaviour."""
    import inspect

    try:
        import triton
    except ImportError:  # the torch reference's tests run without triton
        return
    import triton.language as tl
    from triton.runtime import interpreter

    if triton.__version__ != "3.6.0":
        return
    patch, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    patched: set = set()  # the modules patched since the running launch began
    seen: dict = {}  # a function -> the language modules its globals hold (those _patch_lang patches)

    def langs(fn) -> set:
        if fn not in seen:
            seen[fn] = {v for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}
        return seen[fn]

    def patch_lang(fn):
        scope = patch(fn)
        patched.update(langs(fn))
        return scope

    def run(self, *args, **kwargs):
        patched.clear()
        try:
            return launch(self, *args, **kwargs)
        finally:
            patched.clear()

    def call(self, *args, **kwargs):
        if not langs(self.fn) <= patched:
            patch_lang(self.fn)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    _STOCK.update({(interpreter, "_patch_lang"): patch, (interpreter.GridExecutor, "__call__"): launch,
                   (interpreter.InterpretedFunction, "__call__"): interpreter.InterpretedFunction.__call__})
    interpreter._patch_lang = patch_lang
    interpreter.GridExecutor.__call__ = run
    interpreter.InterpretedFunction.__call__ = call


def _dot_rows_alone():
    """The interpreter's tl.dot is numpy's float32 matmul, whose sum for a row depends on where that row sits in the
    tile (BLAS blocking and SIMD peeling; seen with numpy 2.4.6's OpenBLAS 0.3.31: a v3 row alone and the same row
    at tile row 6 differ in the last bit), which a GPU's MMA does not: there each output is its own row's sum.
    Here each product is summed in float64 and rounded once to the accumulator's dtype, so a row's result no
    longer depends on its neighbours (the kernels' batch-invariance tests test the kernels, not numpy). Operands are
    converted as the interpreter converts them (fp8 through fp16). Another Triton version keeps its own dot."""
    try:
        import numpy as np
        import triton
        from triton.runtime import interpreter
    except ImportError:
        return
    if triton.__version__ != "3.6.0":
        return
    import triton.language as tl

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        a_data, b_data = a.data, b.data
        if (a.dtype.primitive_bitwidth == 8 and a.dtype.is_floating()) or \
           (b.dtype.primitive_bitwidth == 8 and b.dtype.is_floating()):
            a_data = interpreter._convert_float(a_data, a.dtype, tl.float16, None).view(np.float16)
            b_data = interpreter._convert_float(b_data, b.dtype, tl.float16, None).view(np.float16)
        product = np.matmul(a_data.astype(np.float64), b_data.astype(np.float64)).astype(d.data.dtype)
        return interpreter.TensorHandle(product + d.data, d.dtype.scalar)

    _STOCK[(interpreter.InterpreterBuilder, "create_dot")] = interpreter.InterpreterBuilder.create_dot
    interpreter.InterpreterBuilder.create_dot = create_dot


if os.environ.get("TRITON_INTERPRET") == "1":
    _device_calls_patch_once()
    _dot_rows_alone()


@pytest.fixture
def stock_interpreter(monkeypatch):
    """Triton's own interpreter in this process for the test (as in the ranks it spawns): their bytes comparable."""
    for (owner, name), stock in _STOCK.items():
        monkeypatch.setattr(owner, name, stock)


# The slow set: long interpreter runs of whole models through kernels that CI also covers in unit tests.
# CI (the README's command) skips them to stay within its time; run them with DSV4_SLOW=1.
def pytest_collection_modifyitems(config, items):
    if os.environ.get("DSV4_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow set: DSV4_SLOW=1 runs it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
