"""DSV4_LOG_COMPILES (dsv4/kernels/compile_log.py): the record a kernel compile writes, through Triton's own hook call
(JITFunction._call_hook, as its _do_compile calls it before and after a compile; compiling itself needs a GPU), and
the hooks' installation."""

from __future__ import annotations

import json

import pytest

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from triton import knobs  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from dsv4.kernels import compile_log  # noqa: E402


def _probe_kernel(x_ptr, n, BLOCK: tl.constexpr):
    pass


# A JITFunction itself (the tests' conftest sets Triton's interpreter, under which triton.jit gives another kind)
_probe_kernel = JITFunction(_probe_kernel)


def _options():
    from triton.backends.nvidia.compiler import CUDAOptions

    return CUDAOptions(num_warps=4)


def test_a_compile_writes_its_kernel_signature_and_constants(capsys):
    key = ("args", ["*fp32D", "i32"], "x")
    signature = {"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    hook_args = (key, signature, 0, {(2,): 128}, _options(), [{(0,): [["tt.divisibility", 16]]}], False)
    assert _probe_kernel._call_hook(compile_log.before, *hook_args) is None  # None: Triton compiles as it would
    assert _probe_kernel._call_hook(compile_log.after, *hook_args) is None
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("COMPILE ")]
    assert len(lines) == 1
    record = json.loads(lines[0][len("COMPILE "):])
    assert record["kernel"] == "_probe_kernel" and record["signature"] == "x_ptr: *fp32D, n: i32"
    assert record["constants"] == {"BLOCK": 128} and record["warmup"] is False and record["seconds"] >= 0


def test_install_sets_both_hooks_and_refuses_a_foreign_one(monkeypatch):
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", None)
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)
    compile_log.install()
    assert (knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook) == (compile_log.before,
                                                                                   compile_log.after)
    compile_log.install()  # again: ours already
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", lambda **kw: None)
    with pytest.raises(RuntimeError, match="already set"):
        compile_log.install()
