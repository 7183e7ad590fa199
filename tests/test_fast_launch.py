"""dsv4.kernels.FastLaunch (DSV4_FAST_LAUNCH=1) on CPU: its key against Triton's own specialisation
(native_specialize_impl), its launches against Triton's run (a stand-in compiled kernel), and a tiny model's
eager steps byte-equal through it (the interpreter standing in for the compiled kernels)."""
from __future__ import annotations

import itertools

import pytest
import torch

import dsv4
from dsv4 import kernels

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
from triton._C.libtriton import native_specialize_impl  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402


class _Backend:  # what native_specialize_impl reads of a backend (CUDA's: BaseBackend's True)
    supports_native_tensor_specialization = True


def _views():
    base = {dt: torch.zeros(64, dtype=dt) for dt in (torch.float32, torch.bfloat16, torch.uint8, torch.int32)}
    return [t[o:] for t in base.values() for o in (0, 1, 4, 8, 16)]  # offsets: 16-byte aligned or not


INTS = [0, 1, 2, 15, 16, 17, -1, -16, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 1, -2**31, -2**31 - 1, -2**31 - 16,
        2**63 - 16, 2**63 - 1, 2**63, 2**64 - 16, 2**64 - 1]
OTHERS = [0.0, 1.0, -2.5, True, False, None]


@pytest.mark.parametrize("align", [True, False])
def test_arg_spec_is_tritons_specialisation(align):
    """Two arguments of one type with equal arg_spec get equal specialisations from Triton's binder, for every
    parameter flag (specialize, align); with all flags on (the finest), equal specialisation means equal spec."""
    values = _views() + INTS + OTHERS
    for a, b in itertools.combinations(values, 2):
        if type(a) is not type(b):
            continue
        same_spec = kernels.arg_spec(a) == kernels.arg_spec(b)
        for specialize in (True, False):
            na, nb = (native_specialize_impl(_Backend, v, False, specialize, align) for v in (a, b))
            if same_spec:
                assert na == nb, (a, b, specialize, align)
            elif specialize and align:
                assert na != nb, (a, b)


def test_arg_spec_cases():
    x = torch.zeros(64, dtype=torch.bfloat16)
    assert kernels.arg_spec(x) == (torch.bfloat16, True) and kernels.arg_spec(x[1:]) == (torch.bfloat16, False)
    assert kernels.arg_spec(x[8:]) == (torch.bfloat16, True)
    assert kernels.arg_spec(1) == "one" and kernels.arg_spec(16) == "i32D" and kernels.arg_spec(17) == "i32"
    assert kernels.arg_spec(2**31) == "i64D" and kernels.arg_spec(2**63) == "u64D"
    assert kernels.arg_spec(2**64) is None and kernels.arg_spec(-2**63 - 1) is None  # Triton raises: run's error
    assert kernels.arg_spec((1, 2)) is None and kernels.arg_spec(torch.float32) is None  # left to run
    assert kernels.arg_spec(True) is bool and kernels.arg_spec(1.0) is float


def _kernel(x, y, n, eps, FLAG: tl.constexpr, BLOCK: tl.constexpr = 16):
    pass


class _Compiled:
    """A stand-in CompiledKernel: records each launch as CompiledKernel.run receives it."""

    def __init__(self, log):
        self.function, self.packed_metadata, self.log = "cufunction", ("meta",), log

    def run(self, *launch):
        self.log.append(("fast", launch))


@pytest.fixture
def fast(monkeypatch):
    """A FastLaunch of _kernel whose Triton run is a stand-in (returns one compiled kernel per call), on device 3,
    stream 77; the log records (path, arguments)."""
    jit = JITFunction(_kernel)
    log = []

    def run(*args, grid, warmup, **kwargs):
        log.append(("run", args, grid, kwargs))
        return _Compiled(log)

    monkeypatch.setattr(jit, "run", run)
    monkeypatch.setattr(kernels, "current_device", lambda: 3)
    monkeypatch.setattr(kernels, "_raw_stream", lambda device: 70 + device + 4)
    return kernels.FastLaunch(jit), log


def test_fast_launch_takes_run_once_per_key(fast):
    f, log = fast
    x, y = torch.zeros(32), torch.zeros(32, dtype=torch.bfloat16)
    f[(4, 2)](x, y, 32, 0.5, FLAG=True, num_warps=4)
    f[(5,)](x, y, 48, 0.25, FLAG=True, num_warps=4)  # same key: 32, 48 both i32 % 16 == 0
    assert [e[0] for e in log] == ["run", "fast"]
    # CompiledKernel.run's arguments as jit.py 744-745 pass them: grid, stream, function, metadata, no hooks,
    # then every parameter in signature order, the default BLOCK included
    assert log[1][1] == (5, 1, 1, 77, "cufunction", ("meta",), None, None, None, x, y, 48, 0.25, True, 16)
    calls = [
        ((x[1:], y, 32, 0.5), {"FLAG": True, "num_warps": 4}),  # unaligned tensor
        ((x, y.float(), 32, 0.5), {"FLAG": True, "num_warps": 4}),  # dtype
        ((x, y, 33, 0.5), {"FLAG": True, "num_warps": 4}),  # int % 16
        ((x, y, 1, 0.5), {"FLAG": True, "num_warps": 4}),  # int == 1
        ((x, y, 2**31, 0.5), {"FLAG": True, "num_warps": 4}),  # i64
        ((x, y, 32, 0.5), {"FLAG": 1, "num_warps": 4}),  # constexpr True vs 1
        ((x, y, 32, 0.5), {"FLAG": False, "num_warps": 4}),  # constexpr value
        ((x, y, 32, 0.5), {"FLAG": True, "num_warps": 8}),  # option value
        ((x, y, 32, 0.5), {"FLAG": True}),  # option absent
        ((x, y, 32, 0.5), {"FLAG": True, "BLOCK": 16, "num_warps": 4}),  # the default given by name
        ((x, y, 32, 1), {"FLAG": True, "num_warps": 4}),  # float argument given an int
    ]
    for args, kw in calls:
        del log[:]
        f[(1,)](*args, **kw)
        f[(1,)](*args, **kw)
        assert [e[0] for e in log] == ["run", "fast"], (args, kw)
    del log[:]
    f[(4, 2)](x, y, 32, 0.5, FLAG=True, num_warps=4)
    assert [e[0] for e in log] == ["fast"]


def test_fast_launch_binds_keywords_in_signature_order(fast):
    f, log = fast
    x, y = torch.zeros(32), torch.zeros(32)
    for _ in range(2):
        f[(1,)](x, y, BLOCK=64, FLAG=False, eps=2.0, n=16)
    assert [e[0] for e in log] == ["run", "fast"]
    assert log[1][1][9:] == (x, y, 16, 2.0, False, 64)


def test_fast_launch_leaves_to_run(fast, monkeypatch):
    """A callable grid, an argument type it does not key, a launch hook, a pre-run hook: always Triton's run."""
    f, log = fast
    x, y = torch.zeros(32), torch.zeros(32)
    for _ in range(2):
        f[lambda meta: (1,)](x, y, 16, 0.5, FLAG=True)
        f[(1,)](x, y, (16, 32), 0.5, FLAG=True)
        f[(1,)](x, y, 16, 0.5, FLAG=[1])  # unhashable constexpr
    assert [e[0] for e in log] == ["run"] * 6
    from triton import knobs

    f[(1,)](x, y, 16, 0.5, FLAG=True)
    hook = lambda metadata: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        f[(1,)](x, y, 16, 0.5, FLAG=True)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    f.jit.add_pre_run_hook(lambda *a, **k: None)
    f[(1,)](x, y, 16, 0.5, FLAG=True)
    assert [e[0] for e in log[6:]] == ["run"] * 3


def test_fast_launch_device_in_key(fast, monkeypatch):
    f, log = fast
    x, y = torch.zeros(32), torch.zeros(32)
    f[(1,)](x, y, 16, 0.5, FLAG=True)
    monkeypatch.setattr(kernels, "current_device", lambda: 5)
    f[(1,)](x, y, 16, 0.5, FLAG=True)
    f[(1,)](x, y, 16, 0.5, FLAG=True)
    assert [e[0] for e in log] == ["run", "run", "fast"] and log[2][1][3] == 79  # device 5's stream


def test_equal_keys_are_equal_triton_keys():
    """Over every combination of _kernel's launches below (tensors of two dtypes and alignments, ints, a float
    argument given an int, constexprs of several types, options, the default given or not): launches with equal
    FastLaunch keys get equal cache keys from Triton's own binder and compute_cache_key (what JITFunction.run
    looks its kernel up by: with a fresh key cache, which tells True from 1)."""
    from triton.runtime.jit import compute_cache_key, create_function_from_signature

    jit = JITFunction(_kernel)
    binder = create_function_from_signature(jit.signature, jit.params, _Backend)
    f32, bf16 = torch.zeros(64), torch.zeros(64, dtype=torch.bfloat16)
    tensors = [f32, f32[1:], f32[4:], bf16]
    blocks = [{}, {"BLOCK": 16}, {"BLOCK": True}]
    options = [{}, {"num_warps": 4}, {"num_warps": 8}, {"num_stages": 2}]
    ours, theirs = {}, {}
    for x, y, n, eps, flag, block, opt in itertools.product(tensors, tensors, [1, 16, 17, 2**31], [0.5, 2],
                                                            [True, False, 1, 0, 1.0, None], blocks, options):
        args, kw = (x, y, n, eps), {"FLAG": flag, **block, **opt}
        _, key = kernels._Plan(jit, len(args), tuple(kw)).key(args, kw, (False, "", 0))
        _, spec, opts = binder(*args, **kw, debug=False, instrumentation_mode="")
        triton_key = compute_cache_key({}, spec, opts)
        assert ours.setdefault(key, triton_key) == triton_key, (args, kw)
        theirs.setdefault(triton_key, set()).add(key)
    assert len(ours) < 4 * 4 * 4 * 2 * 6 * 3 * 4  # keys repeat: launches were compared
    # Triton keys "BLOCK": 16 given and left to its default alike (FastLaunch apart: finer, never coarser)
    assert len(theirs) < len(ours)


class _Driver:
    """Triton's active driver as JITFunction.run reads it (device 0, stream 77, an sm_90 target)."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 77

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)


def test_fast_launch_passes_what_tritons_run_passes(monkeypatch):
    """Triton's own JITFunction.run (a stand-in driver, its kernel cache holding a stand-in compiled kernel for
    the launch's key) and FastLaunch's later launches give CompiledKernel.run the same grid, stream, function,
    metadata and arguments; FastLaunch passes no launch metadata and no hooks where run's hooks are empty."""
    from triton.runtime.driver import driver
    from triton.runtime.jit import compute_cache_key

    monkeypatch.setattr(driver, "_active", _Driver())
    monkeypatch.setattr(kernels, "current_device", lambda: 0)
    monkeypatch.setattr(kernels, "_raw_stream", lambda device: 77)
    jit = JITFunction(_kernel)
    log = []
    compiled = _Compiled(log)
    compiled.launch_metadata = lambda grid, stream, *args: "metadata"
    x, y = torch.zeros(32), torch.zeros(32)
    args, kw = (x, y, 48, 0.5), {"FLAG": True, "num_warps": 4}
    cache, key_cache, _, _, binder = jit.device_caches[0]
    _, spec, options = binder(*args, **kw, debug=False, instrumentation_mode="")
    cache[compute_cache_key(key_cache, spec, options)] = compiled
    f = kernels.FastLaunch(jit)
    assert f[(3, 2)](*args, **kw) is compiled and f[(3, 2)](*args, **kw) is compiled
    (_, by_run), (_, by_fast) = log
    assert by_run[6] == "metadata" and all(hook.calls == [] for hook in by_run[7:9])  # empty HookChains
    assert by_fast[6:9] == (None, None, None)
    assert by_run[:6] + by_run[9:] == by_fast[:6] + by_fast[9:] == (3, 2, 1, 77, "cufunction", ("meta",), x, y, 48,
                                                                    0.5, True, 16)


@pytest.mark.skipif(not kernels.interpreting(), reason="the interpreter's case")
def test_switch_is_a_no_op_under_the_interpreter(monkeypatch):
    monkeypatch.setattr(kernels, "FAST_LAUNCH", True)
    x = torch.zeros(4)
    k = kernels.launcher(_kernel, x)
    assert k is kernels._compiled[_kernel] and not isinstance(k, kernels.FastLaunch)
    assert kernels.fast_launch(k) is k


class _InterpretedJIT:
    """An interpreted kernel dressed as a JITFunction: its run (Triton's path) interprets the launch and returns
    a _InterpretedCompiled in place of the compiled kernel."""

    def __init__(self, interpreted, counts):
        self.interpreted, self.counts = interpreted, counts
        self.params = JITFunction(interpreted.fn).params
        self.pre_run_hooks, self.used_global_vals = [], {}

    def run(self, *args, grid, warmup, **kwargs):
        self.counts["run"] += 1
        self.interpreted.run(*args, grid=grid, warmup=warmup, **kwargs)
        return _InterpretedCompiled(self.interpreted, self.counts)


class _InterpretedCompiled:
    """A stand-in CompiledKernel whose run interprets the kernel on exactly the arguments FastLaunch passes (the
    binder's: every parameter in signature order)."""

    function, packed_metadata = "cufunction", ("meta",)

    def __init__(self, interpreted, counts):
        self.interpreted, self.counts = interpreted, counts

    def run(self, g0, g1, g2, stream, function, metadata, launch_metadata, enter_hook, exit_hook, *values):
        self.counts["fast"] += 1
        assert (stream, function, launch_metadata, enter_hook, exit_hook) == (0, "cufunction", None, None, None)
        self.interpreted[(g0, g1, g2)](*values)


class _FastCompiled(dict):
    """kernels._compiled whose lookups after a kernel's first launch give its FastLaunch over the interpreter
    (launcher stores each jitted kernel here at its first launch)."""

    def __init__(self, counts):
        super().__init__()
        self.counts = counts

    def __setitem__(self, fn, interpreted):
        super().__setitem__(fn, kernels.FastLaunch(_InterpretedJIT(interpreted, self.counts)))


def _steps(monkeypatch, counts=None):
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    if counts is not None:
        monkeypatch.setattr(kernels, "_compiled", _FastCompiled(counts))
        monkeypatch.setattr(kernels, "current_device", lambda: 0)
        monkeypatch.setattr(kernels, "_raw_stream", lambda device: 0)
    model = dsv4.load("tiny", device="cpu", dtype=torch.float32)
    state = model.new_state(8)
    sp = dsv4.SamplingParams(temperature=0.8, top_p=0.9, seed=5)
    tokens = [model.step(state, 3, sp)]
    tokens.append(model.step(state, tokens[-1], sp))
    return tokens, model.digests(state), state.logits.clone()


@pytest.mark.skipif(not kernels.interpreting(), reason="CPU tensors under DSV4_KERNELS=triton need the interpreter")
def test_model_steps_equal_through_fast_launch(monkeypatch):
    """Two eager steps of tiny, every kernel launched by the interpreter directly (off) or, after each key's
    first launch, through FastLaunch's bound arguments: tokens, digests and logits equal."""
    off = _steps(monkeypatch)
    counts = {"run": 0, "fast": 0}
    on = _steps(monkeypatch, counts)
    assert counts["fast"] > counts["run"] > 0
    assert off[0] == on[0] and off[1] == on[1] and torch.equal(off[2], on[2])
