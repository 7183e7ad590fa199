import os

import torch

# Triton's interpreter runs the fused kernels on CPU tensors (tests/test_kernels.py). It has to be
# chosen before triton is first imported; on a GPU machine the kernels compile for the device instead.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


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

    interpreter._patch_lang = patch_lang
    interpreter.GridExecutor.__call__ = run
    interpreter.InterpretedFunction.__call__ = call


if os.environ.get("TRITON_INTERPRET") == "1":
    _device_calls_patch_once()


# The slow set: long interpreter runs of whole models through kernels that CI also covers in unit tests.
# CI (the README's command) skips them to stay within its time; run them with DSV4_SLOW=1.
def pytest_collection_modifyitems(config, items):
    import pytest

    if os.environ.get("DSV4_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow set: DSV4_SLOW=1 runs it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
