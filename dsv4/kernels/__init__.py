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

`DSV4_FAST_LAUNCH` (read at import; FAST_LAUNCH below; on by default since session 9, `0` turns it off): a CUDA launch whose arguments Triton would
specialise as an earlier launch's were goes straight to that launch's compiled kernel (FastLaunch), skipping
the host work of Triton's JITFunction.run. The device runs the same kernel on the same arguments
(session 9, call 1 on an H200: mini's eager step 12.74 -> 10.09 ms with equal tokens, logits and cache bytes).

`DSV4_PDL` (read at import; PDL below; on by default since session 18 where every GPU has compute capability 9.0+,
`0` turns it off, `1` forces it; off under the interpreter): programmatic dependent launch. A decode step is a chain
of ~150 (mini) to ~1,100 (a Flash rank) kernels, most of them latency-bound, and without PDL each starts only once
the one before it has drained: a launch gap (~1 us in a graph) and, for a GEMV, its first DRAM round trip on the
critical path. Under PDL every Triton kernel is launched
with `launch_pdl` (launcher adds it) and may start while its predecessor in the stream runs; its programs wait in
pdl_wait (griddepcontrol.wait: the predecessor complete and its memory visible) before they touch anything the step
produces or writes, and only then release their own successor (griddepcontrol.launch_dependents), so no grid runs
ahead of an unfinished one. pdl_wait is a kernel's first statement, except in the weight-streaming kernels (qgemv's
linear and dense's on a stored weight, v2 and v3 alike, the shared expert's gate/up programs, the mHC boundary's hc_fn
slice, a top-k layer's router bias), which load their first weight tile (a module parameter, never written by a step)
before it. A kernel may also read before its wait what the kernel two or more launches back wrote, where its caller
says that is all it reads (an `early` argument; the kernel's constant EARLY): each kernel releases the next only after
its own wait, so when a kernel starts, every kernel but the one right before it is complete. The compressor's pools and
index keys have such forms (dsv4.kernels.compressor CONFIG early), as have kernel 1's shared expert programs
(dsv4.kernels.moe_gl CONFIG shared_early), and the model's order makes their inputs old enough. tests/compile_kernels.py checks the PTX of every kernel against this
contract (its EARLY and BEHIND tables). The arithmetic is the same, so are the bits. A kernel after a torch op (which never releases early) starts as it would without PDL.
What the work before a wait buys (session 45, benchmarks/RESULTS.md): a released kernel's programs become resident only
where an SM has room, so after a grid that fills the SMs (the 0.97-wave GEMVs, the experts' kernel 2) they start in its
drain (~1-2 us, benchmarks/chain_leads.py), after a narrow one (a boundary's 32 programs) many microseconds early; and
ptxas schedules pure arithmetic across griddepcontrol.wait (only memory operations are ordered by it), so sums meant to
run before the wait may run after it unless something the compiler must respect (a branch on them) holds them.
(Sessions 7-17 launched only the weight-streaming kernels this way, the others releasing first; session 18 put the
whole chain under it.)
"""

from __future__ import annotations

import functools
import os

import torch

try:
    import triton.language as tl
except ImportError:  # the torch reference runs without triton; the kernels are never built then
    tl = None

MODES = ("auto", "torch", "triton")

# os.environ.get costs ~0.5 us (it encodes the name and decodes the value) and the eager step asks ~150 times a
# token (every kernel's use_triton). On POSIX os.environ keeps its bytes in _data, which every os.environ
# write (monkeypatch.setenv included) updates: reading it sees what os.environ.get sees, ~10x faster.
_ENV_DATA = getattr(os.environ, "_data", None) if os.name == "posix" else None


def getenv(name: str, default: str) -> str:
    """os.environ.get(name, default), cheaper on POSIX (see _ENV_DATA)."""
    if _ENV_DATA is None:
        return os.environ.get(name, default)
    raw = _ENV_DATA.get(name.encode())
    return default if raw is None else os.fsdecode(raw)


def mode() -> str:
    m = getenv("DSV4_KERNELS", "auto")
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


GEMVS = ("v2", "v3", "mma")


def gemv() -> str:
    """The decode GEMVs' kernel family (qgemv's and dense's CONFIG["kernel"]; see select_gemv)."""
    from . import dense, qgemv

    return qgemv.CONFIG["kernel"] if qgemv.CONFIG["kernel"] == dense.CONFIG["kernel"] else \
        f"qgemv {qgemv.CONFIG['kernel']}, dense {dense.CONFIG['kernel']}"


def select_gemv(name: str) -> None:
    """The decode GEMVs' kernels for this process and the ranks it spawns after this call (they read
    DSV4_QGEMV / DSV4_DENSE_GEMV at import): "v2", one row per program's own multiply-adds (fastest for one
    sequence), or "v3", tensor-core tiles of 16 rows (a batched step's GEMVs ~4x faster at 16 rows, a lone row
    ~25 % slower: benchmarks/RESULTS.md, session 7), or "mma" (the FP8 GEMVs as m16n8k16 products, the rows their
    columns, dsv4.kernels.qgemv_mma; the bf16 GEMVs v3's). Either way a row's bits do not depend on the batch, but
    the families give a row different bits: a model's outputs are comparable within one choice."""
    from . import dense, qgemv

    if name not in GEMVS:
        raise ValueError(f"gemv {name!r}: allowed {list(GEMVS)}")
    qgemv.CONFIG["kernel"] = name
    dense.CONFIG["kernel"] = "v3" if name == "mma" else name
    os.environ["DSV4_QGEMV"], os.environ["DSV4_DENSE_GEMV"] = name, dense.CONFIG["kernel"]


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
    return getenv("TRITON_INTERPRET", "0") == "1"


def _pdl() -> bool:
    """DSV4_PDL: "1" on, "0" off; unset, on where CUDA has devices and all of them are sm_90 or newer (the
    capability query initialises CUDA at import on a GPU machine). Off under the interpreter."""
    v = getenv("DSV4_PDL", "")
    if v not in ("", "0", "1"):
        raise ValueError(f"DSV4_PDL={v!r}: allowed '0', '1' or unset (on where every GPU is sm_90+)")
    if interpreting() or v == "0":
        return False
    if v == "1":
        return True
    return torch.cuda.is_available() and all(torch.cuda.get_device_capability(i)[0] >= 9
                                             for i in range(torch.cuda.device_count()))


PDL = _pdl()  # read once: a process compiles its kernels one way
if getenv("DSV4_LOG_COMPILES", "0") == "1" and not interpreting():  # a line a compile (kernels/compile_log.py)
    from . import compile_log

    compile_log.install()


def launcher(fn, t: torch.Tensor):
    """The Triton kernel for the plain function `fn` (compiled once, or interpreted on CPU); with FAST_LAUNCH
    and a CUDA t, its FastLaunch; under PDL, launched with launch_pdl (with_pdl)."""
    if not t.is_cuda and not interpreting():
        raise RuntimeError(f"{fn.__name__}: a CPU tensor needs Triton's interpreter; set TRITON_INTERPRET=1 "
                           "before starting Python, or DSV4_KERNELS=auto|torch")
    k = _compiled.get(fn)
    if k is None:
        import triton

        if interpreting():
            _round_like_the_gpu()
        elif PDL and t.is_cuda and torch.cuda.get_device_capability(t.device)[0] < 9:
            raise RuntimeError("DSV4_PDL=1: programmatic dependent launch needs compute capability 9.0 or more")

        # A kernel function may name arguments Triton must not specialise (an int 1 a constant, multiples of 16
        # marked): one compile for all their values (fn.do_not_specialize; none by default).
        k = _compiled[fn] = triton.jit(fn, do_not_specialize=getattr(fn, "do_not_specialize", None))
    if FAST_LAUNCH and t.is_cuda:
        f = _fast.get(fn)
        if f is None:
            f = _fast[fn] = with_pdl(fast_launch(k))
        return f
    return with_pdl(k)


def with_pdl(k):
    """k, whose launches under DSV4_PDL all carry launch_pdl (the module's doc: every kernel waits in pdl_wait)."""
    return _LaunchPdl(k) if PDL else k


class _LaunchPdl:
    def __init__(self, k):
        self.k = k

    def __getitem__(self, grid):
        return functools.partial(self.k[grid], launch_pdl=True)


FAST_LAUNCH = getenv("DSV4_FAST_LAUNCH", "1") == "1"
_fast: dict = {}


def gluon_launcher(kernel):
    """A Gluon kernel's launcher (dsv4.kernels.moe_gl, qgemv_mma): its FastLaunch under DSV4_FAST_LAUNCH, else the
    kernel; under DSV4_PDL with launch_pdl (with_pdl)."""
    if not FAST_LAUNCH:
        return with_pdl(kernel)
    f = _fast.get(kernel)
    if f is None:
        f = _fast[kernel] = with_pdl(fast_launch(kernel))
    return f


def fast_launch(k):
    """k's FastLaunch; k itself when it has no compiled kernels (the interpreter's InterpretedFunction)."""
    from triton.runtime.jit import JITFunction

    return FastLaunch(k) if isinstance(k, JITFunction) else k


class FastLaunch:
    """A jitted kernel whose launches after the first of each specialisation go straight to its compiled kernel.

    Triton's JITFunction.run (triton 3.6.0, triton/runtime/jit.py lines 695-746) does on every launch: its
    options (696-697), the device and stream (700-701), pre-run hooks (704-705), the binder (710;
    create_function_from_signature, 391-448: native_specialize_impl on every argument), its cache key
    (712; compute_cache_key, 563-584, formats the options with str), the used globals' check (725-729) and
    launch_metadata for the launch hooks (743), then CompiledKernel.run (744-745). Here the first launch of
    a key takes that run (which compiles if it must, and launches); the compiled kernel it returns is kept
    under the key, and a later launch of the key calls CompiledKernel.run as 744-745 do, on the same
    arguments in the same order (the binder's, signature order with defaults), with no launch metadata and
    no hooks (run passes empty HookChains, which call nothing).

    The key refines Triton's key: equal keys give equal Triton keys on one device, so the kept kernel is the
    one run would pick (run's kernel cache, one per device, only gains entries). It holds:
      - each non-constexpr argument as native_specialize_impl sees it (triton 3.6.0 python/src/specialize.cc:
        handle_tensor, handle_long_type, handle_bool_type, handle_float_type, None; arg_spec): a tensor's
        dtype and whether data_ptr % 16 == 0 ("D"; the CUDA backend's supports_native_tensor_specialization,
        or get_tensor_specialization, backends/compiler.py 89-92, tests the same); an int's == 1 (specialised
        to a constexpr 1), % 16 == 0 ("D") and range (i32, i64, u64; outside [-2**63, 2**64) Triton raises,
        so such ints always take run); bools (u1), floats (fp32) and None by their type alone. A parameter's
        is_const / do_not_specialize / do_not_specialize_on_alignment flags are fixed, so a key that always
        specialises is finer than run's;
      - each constexpr's value and type (True == 1 == 1.0 in Python; run's own first-level key cache, 564-567,
        takes True for 1 once it has seen one of them: the key here is finer);
      - the options, the keyword arguments that are not parameters (num_warps, num_stages, ...; the binder's
        **options), by name, value and type, and the two run adds: knobs.runtime.debug and
        knobs.compilation.instrumentation_mode;
      - the binding: the count of positional arguments and the keyword names in order (the defaults follow);
      - the current device (run's kernel caches are per device; a CUfunction is loaded on one device).
    The stream is not part of a compiled kernel: it is read on every launch as run reads it (701), so launches
    under CUDA graph capture go to the capture stream. Anything else takes run: other argument types (tuples,
    tensor descriptors, dtypes), a callable grid, pre-run hooks, launch hooks, a kernel still compiling.
    """

    def __init__(self, jit):
        from triton import knobs

        self.jit = jit
        self.runtime_knobs, self.compilation_knobs = knobs.runtime, knobs.compilation
        self.plans: dict = {}
        self.kernels: dict = {}

    def __getitem__(self, grid):
        return functools.partial(self.launch, grid)

    def launch(self, grid, *args, **kwargs):
        binding = (len(args), tuple(kwargs))
        plan = self.plans.get(binding)
        if plan is None:
            plan = self.plans[binding] = _Plan(self.jit, *binding)
        rt = self.runtime_knobs
        entry = key = None
        if plan.ok and type(grid) is tuple and not self.jit.pre_run_hooks and not _hooked(rt.launch_enter_hook) \
                and not _hooked(rt.launch_exit_hook):
            device = current_device()
            vals, key = plan.key(args, kwargs, (rt.debug, self.compilation_knobs.instrumentation_mode, device))
            try:
                entry = None if key is None else self.kernels.get(key)
            except TypeError:  # an unhashable constexpr or option
                key = None
        if entry is None:
            kernel = self.jit.run(*args, grid=grid, warmup=False, **kwargs)
            if key is not None and kernel is not None and not hasattr(kernel, "result"):
                self.kernels[key] = (kernel, kernel.run, kernel.function, kernel.packed_metadata)
            return kernel
        if self.jit.used_global_vals:
            self._check_globals()
        kernel, run, function, metadata = entry
        n = len(grid)
        run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, _raw_stream(device), function, metadata,
            None, None, None, *vals)
        return kernel

    def _check_globals(self):
        """run's check that the globals a kernel read when it compiled are unchanged (jit.py 725-729)."""
        for (name, _), (val, globals_dict) in self.jit.used_global_vals.items():
            if (now := globals_dict.get(name, _MISSING)) != val:
                raise RuntimeError(f"Global variable {name} has changed since we compiled this kernel, "
                                   f"from {val} to {now}")


_MISSING = object()


class _Plan:
    """How one binding (positional count, keyword names) of a kernel's call fills its parameters, and its key.

    The usual binding (every runtime argument by position, then constexprs by name in signature order, then
    options) keys the keyword values as they come; any other goes parameter by parameter."""

    def __init__(self, jit, n_args: int, kw_names: tuple):
        params = jit.params
        names = [p.name for p in params]
        self.binding = (n_args, kw_names)
        self.tail = []  # parameters after the positional ones: (True, name) from kwargs, (False, default)
        for p in params[n_args:]:
            if p.name in kw_names:
                self.tail.append((True, p.name))
            elif p.has_default:
                self.tail.append((False, p.default))
            else:
                self.tail = None  # run raises the missing argument's error
                break
        self.ok = self.tail is not None and n_args <= len(params)
        self.options = tuple(k for k in kw_names if k not in names)
        self.constexprs = tuple(i for i, p in enumerate(params) if p.is_constexpr)
        self.runtime = tuple(i for i, p in enumerate(params) if not p.is_constexpr)
        m = len(kw_names) - len(self.options)
        self.by_name = m  # the usual binding's constexprs given by name, first among kw_names
        self.defaults = tuple(x for by_name, x in self.tail[m:]) if self.ok else ()
        self.usual = self.ok and self.runtime == tuple(range(n_args)) and \
            kw_names[:m] == tuple(names[n_args:n_args + m]) and all(not by for by, _ in self.tail[m:])
        self.key = self._usual_key if self.usual else self._key

    def values(self, args, kwargs) -> tuple:
        """The binder's bound arguments, in signature order."""
        return args + tuple([kwargs[x] if by_name else x for by_name, x in self.tail])

    def _usual_key(self, args, kwargs, context: tuple):
        spec = tuple(map(arg_spec, args))
        if None in spec:
            return None, None
        kv = tuple(kwargs.values())
        vals = args + kv[:self.by_name] + self.defaults if self.options or self.defaults else args + kv
        return vals, (self.binding, spec, kv, tuple(map(type, kv)), context)

    def _key(self, args, kwargs, context: tuple):
        vals = self.values(args, kwargs)
        spec = tuple([arg_spec(vals[i]) for i in self.runtime])
        if None in spec:
            return None, None
        consts = tuple([vals[i] for i in self.constexprs])
        opts = tuple([kwargs[k] for k in self.options])
        return vals, (self.binding, spec, consts, tuple(map(type, consts)), opts, tuple(map(type, opts)), context)


def arg_spec(v):
    """What Triton's binder specialises of a non-constexpr argument v (native_specialize_impl, see FastLaunch),
    or None for a type this module leaves to Triton's run."""
    t = type(v)
    if t is int:
        if v == 1:
            return "one"
        if -0x80000000 <= v <= 0x7FFFFFFF:
            return "i32D" if v & 15 == 0 else "i32"
        if -0x8000000000000000 <= v <= 0x7FFFFFFFFFFFFFFF:
            return "i64D" if v & 15 == 0 else "i64"
        if 0 <= v <= 0xFFFFFFFFFFFFFFFF:
            return "u64D" if v & 15 == 0 else "u64"
        return None
    if t is _Tensor or isinstance(v, _Tensor):
        return (v.dtype, v.data_ptr() & 15 == 0)
    if t is float or t is bool or v is None:
        return t
    return None


_Tensor = torch.Tensor


def _hooked(hook) -> bool:
    """Whether a launch hook (a profiler's) would be called: run then passes it launch metadata."""
    return hook is not None and (type(hook).__name__ != "HookChain" or bool(hook.calls))


def current_device() -> int:
    """The current CUDA device, as Triton's driver reads it (torch.cuda.current_device, less its lazy init:
    a launch's first run went through Triton, which initialised CUDA)."""
    return torch._C._cuda_getDevice()


def _raw_stream(device: int) -> int:
    """The current stream of device, as Triton's driver reads it (get_current_stream)."""
    return torch._C._cuda_getCurrentRawStream(device)


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



def _wait_and_release():
    """pdl_wait with DSV4_PDL (every kernel is launched with launch_pdl): wait until the previous kernel in the stream
    has completed with its memory visible, then release the next. Before it the kernel reads only stored weights;
    releasing after it keeps every early grid behind a finished one."""
    tl.extra.cuda.gdc_wait()
    tl.extra.cuda.gdc_launch_dependents()


def _nothing():
    """pdl_wait (and pdl_release) without DSV4_PDL."""


# Chosen at import rather than by a global constexpr read in one function: FastLaunch would check such a global on
# every launch (JITFunction.used_global_vals).
pdl_wait = device_function(_wait_and_release if PDL else _nothing)


def _release():
    """The next kernel released before this one's wait (griddepcontrol.launch_dependents first): only where the
    caller says the next kernel reads before its own wait nothing that the kernel before this one writes (it may
    then start while that kernel still runs: dsv4.kernels.moe_gl CONFIG down_prefetch)."""
    tl.extra.cuda.gdc_launch_dependents()


pdl_release = device_function(_release if PDL else _nothing)
