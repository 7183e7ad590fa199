"""The kernel launches of one decode step, counted on CPU: every aten op that would launch a CUDA kernel
(or a device copy) and every Triton launch, by op and by the dsv4 line that issued it.

Views, aliases and allocations (empty, views' metadata) launch nothing on a GPU and are not counted. The
Triton kernels are counted and not run (`launches_counted`): a count needs no numbers, and a graph-safe step's
ops do not depend on them (static shapes, no host branch on device values).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 DSV4_KERNELS=triton TRITON_INTERPRET=1 python tests/launches.py
prints the census of tiny's solo step and pooled B=4 step: LAUNCH_OP and LAUNCH_SITE records, one per line.
"""

from __future__ import annotations

import collections
import contextlib
import json
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import dsv4

_TORCH = str(Path(torch.__file__).resolve().parent)
_PACKAGE = str(Path(dsv4.__file__).resolve().parent)

# Ops that only make a view or an alias, or allocate without writing: no kernel on a GPU.
_NO_LAUNCH = frozenset({
    "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::_reshape_alias", "aten::slice", "aten::select",
    "aten::expand", "aten::as_strided", "aten::unsqueeze", "aten::squeeze", "aten::transpose", "aten::t",
    "aten::permute", "aten::alias", "aten::detach", "aten::split", "aten::split_with_sizes", "aten::unbind",
    "aten::chunk", "aten::narrow", "aten::diagonal", "aten::view_as_real", "aten::view_as_complex",
    "aten::lift_fresh", "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::unfold",
    "aten::_local_scalar_dense", "aten::is_pinned", "aten::set_", "aten::resize_", "aten::sym_size",
    "aten::sym_stride", "aten::sym_numel", "aten::sym_storage_offset", "aten::is_same_size", "aten::detach_",
})


def _site() -> str:
    """The innermost dsv4 frame (file:line function) of the op being dispatched."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_PACKAGE):
            return f"{Path(name).relative_to(Path(_PACKAGE).parent).as_posix()}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


class Census(TorchDispatchMode):
    """Counts the launching ops dispatched within, by op name (`ops`) and by (site, op) (`sites`)."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.sites: collections.Counter = collections.Counter()

    def record(self, name: str):
        self.ops[name] += 1
        self.sites[(_site(), name)] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _composite(func):  # the ops it decomposes into are what launch: dispatched here again
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        name = func._schema.name
        if name not in _NO_LAUNCH and not _same_bytes(func, args):
            self.record(name)
        return func(*args, **kwargs)

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def _composite(func) -> bool:
    """A composite op (matmul, einsum, to, flatten, ...): itself no kernel, a sequence of other ops."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")


def _same_bytes(func, args) -> bool:
    """A copy of a tensor onto itself: torch returns early, no kernel."""
    return func._schema.name == "aten::copy_" and args[0].data_ptr() == args[1].data_ptr() and \
        args[0].dtype == args[1].dtype and args[0].stride() == args[1].stride()


@contextlib.contextmanager
def launches_counted(census: Census | None, run: bool = False):
    """Every Triton launch of dsv4.kernels recorded in `census` (when given) as triton::<kernel>, and not run (run:
    run too, outside the census's mode, for a step whose later ops read what a kernel wrote: a verify step's indices)."""
    import importlib
    import pkgutil

    import dsv4.kernels as kernels
    from torch.utils._python_dispatch import _disable_current_modes

    modules = [importlib.import_module(f"dsv4.kernels.{m.name}") for m in pkgutil.iter_modules(kernels.__path__)]
    modules = [m for m in modules if hasattr(m, "launcher")]
    real = {m: m.launcher for m in modules}

    def launcher_of(module):
        def launcher(fn, t):
            kernel = real[module](fn, t) if run else None

            def launch_on(grid):
                def launch(*args, **kwargs):
                    if census is not None:
                        census.record(f"triton::{fn.__name__}")
                    if run:
                        with _disable_current_modes():
                            kernel[grid](*args, **kwargs)
                return launch
            return _Grids(launch_on)
        return launcher

    for m in modules:
        m.launcher = launcher_of(m)
    try:
        yield
    finally:
        for m in modules:
            m.launcher = real[m]


class _Grids:
    """kernel[grid] -> its launch."""

    def __init__(self, launch_on):
        self.launch_on = launch_on

    def __getitem__(self, grid):
        return self.launch_on(grid)


def verify_census(model, state, tokens: torch.Tensor, sampling) -> Census:
    """One verify step (Model.verify_device) of state on tokens, its kernels run (its writes' indices are a kernel's
    output). It commits: the caller's state advances."""
    census = Census()
    with torch.inference_mode(), launches_counted(census, run=True), census:
        model.verify_device(state, tokens, sampling)
    return census


def solo_census(model, sampling=None) -> Census:
    """One warm solo step (Model.step_device: transaction and sampler) of a plain state. Its launches do not
    depend on the state's position (static shapes, no host branch), so the state starts empty."""
    state = model.new_state(40)
    state.input.fill_(7)
    census = Census()
    sampling = sampling or dsv4.SamplingParams(temperature=0.8, top_p=0.9, seed=1)
    with torch.inference_mode(), launches_counted(None):
        model.step_device(state, sampling)  # warm: what is made once per state
        with launches_counted(census), census:
            model.step_device(state, sampling)
    return census


def pooled_census(model, B: int = 4) -> Census:
    """One warm pooled step of B rows (Model.step_batch_device over slots of one StatePool), empty as above."""
    from dsv4.engine import Batch
    from dsv4.state import StatePool

    pool = StatePool(model.cfg, B + 1, 40, model.device, model.dtype)
    states = [pool.state(s) for s in range(B)]
    batch = Batch(states, model.device)
    batch.input.copy_(torch.arange(B) + 7)
    batch.active.fill_(True)
    batch.rows.load([dsv4.SamplingParams(temperature=0.8, top_p=0.9, seed=b) for b in range(B)])
    census = Census()
    with torch.inference_mode(), launches_counted(None), _rows_cos_sin_as_on_cuda():
        model.step_batch_device(batch)
        with launches_counted(census), census:
            model.step_batch_device(batch)
    return census


@contextlib.contextmanager
def _rows_cos_sin_as_on_cuda():
    """The rows' rope tables in one op, as on CUDA (on CPU model.step.rows_cos_sin goes row by row)."""
    import dsv4.model.step as model_step

    real = model_step.rows_cos_sin
    model_step.rows_cos_sin = lambda rope, positions, kind: rope.cos_sin(positions, kind)
    try:
        yield
    finally:
        model_step.rows_cos_sin = real


def _print(kind: str, census: Census):
    print(f"LAUNCH_TOTAL {json.dumps({'step': kind, 'launches': census.total})}")
    for name, n in census.ops.most_common():
        print(f"LAUNCH_OP {json.dumps({'step': kind, 'op': name, 'n': n})}")
    for (site, name), n in sorted(census.sites.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"LAUNCH_SITE {json.dumps({'step': kind, 'site': site, 'op': name, 'n': n})}")


if __name__ == "__main__":
    tiny = dsv4.load(sys.argv[1] if len(sys.argv) > 1 else "tiny", device="cpu")
    _print("solo", solo_census(tiny))
    _print("pooled4", pooled_census(tiny))
