"""DSV4_LOG_COMPILES=1: one line on standard error for each kernel a process compiles (or loads from Triton's disk
cache) after its start, so that a wait nobody expected (a request's first token held by a compile: session 14's
server at concurrency 4 waited ~3.8 s once) names its kernel and the specialisation that was new.

    COMPILE {"kernel": "_experts_kernel", "seconds": 1.42, "signature": "x_ptr: *bf16, P: i32, ...",
             "constants": {"BLOCK_M": 16, ...}, "warmup": false}

Triton's JIT hooks (triton.knobs.runtime.jit_cache_hook before a compile, jit_post_compile_hook after it; Triton
3.6.0 runtime/jit.py _do_compile) give the kernel, its argument types (a `D` suffix: an argument Triton assumed
16-divisible) and its constants; a hook that returns None changes nothing. Off by default; the interpreter (CPU)
compiles nothing and logs nothing."""

from __future__ import annotations

import json
import sys
import time

GPU_CHECKED = False  # no kernel here (dsv4.kernels declares it per module): the hooks have not yet run on a GPU
_started: dict = {}


def before(*, key, repr, fn, compile, is_manual_warmup=False, already_compiled=False, **_):
    """jit_cache_hook: the compile's start (None: Triton compiles as it would)."""
    _started[(fn.name, str(key))] = time.perf_counter()
    return None


def after(*, key, repr, fn, compile, is_manual_warmup=False, already_compiled=False, **_):
    """jit_post_compile_hook: the record."""
    start = _started.pop((fn.name, str(key)), None)
    seconds = None if start is None else round(time.perf_counter() - start, 3)
    signature = repr[repr.index("](") + 2:-1] if "](" in repr else repr
    names = getattr(getattr(fn, "jit_function", None), "arg_names", [])
    constants = {(names[k[0]] if isinstance(k, tuple) and len(k) == 1 and k[0] < len(names) else str(k)):
                 v if isinstance(v, (int, float, bool, str, type(None))) else str(v)
                 for k, v in (compile.get("constants") or {}).items()}
    sys.stderr.write("COMPILE " + json.dumps({"kernel": fn.name, "seconds": seconds, "signature": signature,
                                              "constants": constants, "warmup": bool(is_manual_warmup)}) + "\n")
    sys.stderr.flush()
    return None


def install() -> None:
    """Set the two hooks (replacing none: refused if another is set)."""
    from triton import knobs

    rt = knobs.runtime
    if rt.jit_cache_hook not in (None, before) or rt.jit_post_compile_hook not in (None, after):
        raise RuntimeError("DSV4_LOG_COMPILES=1: Triton's JIT hooks are already set by someone else")
    rt.jit_cache_hook, rt.jit_post_compile_hook = before, after
