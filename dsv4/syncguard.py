"""What a captured step must never do, checked without a GPU.

A CUDA graph records device work only: an op that reads a device value back to
the host (`.item()`, `int(t)`, `.tolist()`, indexing by a 0-dim tensor, a
device-to-host copy) or that sizes its output from data (`nonzero`,
`masked_select`, boolean-mask indexing, `unique`) fails the capture on the GPU
("operation not permitted when stream is capturing"), or worse, bakes one step's
value into every replay. `NoHostSync` raises on each such op as it is
dispatched, on any device, so CI (CPU only) meets the same failure the GPU would,
with the op and the dsv4 line that called it:

    with NoHostSync():
        model.step_device(state, sampling)

Dispatch-level ops are seen through a `TorchDispatchMode`. A copy to the host of a
tensor already on the CPU never reaches the dispatcher (`t.cpu()` returns `t`), so
the guard also refuses the Tensor methods whose purpose is to hand bytes to the host
(`cpu`, `numpy`, `tolist`, `item`, `to("cpu")` from another device).
"""

from __future__ import annotations

import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_PACKAGE = str(Path(__file__).resolve().parent)

# Ops that read a device value on the host, or whose output shape depends on the data.
FORBIDDEN = frozenset({
    "aten::item", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::equal",
    "aten::nonzero", "aten::nonzero_static", "aten::argwhere", "aten::masked_select",
    "aten::unique", "aten::_unique", "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive",
    "aten::bincount", "aten::histc", "aten::_assert_async",
})
_HOST_METHODS = ("cpu", "numpy", "tolist", "item", "__bool__", "__int__", "__float__", "__index__")


class HostSyncError(RuntimeError):
    """An op inside a captured step reads a device value on the host or sizes a tensor from data."""


_TORCH = str(Path(torch.__file__).resolve().parent)


def _issuer():
    """The frame that issued the op: the innermost one outside torch and this module."""
    for frame in reversed(traceback.extract_stack()):
        name = frame.filename
        if not (name.startswith(_TORCH) or name == __file__ or name.startswith("<")):
            return frame
    return None


def _caller() -> str:
    frame = _issuer()
    if frame is None:
        return "unknown"
    where = Path(frame.filename)
    shown = where.relative_to(Path(_PACKAGE).parent) if frame.filename.startswith(_PACKAGE) else where.name
    return f"{shown}:{frame.lineno} in {frame.name}"


def _in_dsv4() -> bool:
    """Whether dsv4's own code asked (not torch's, nor Triton's interpreter running a kernel on CPU)."""
    frame = _issuer()
    return frame is not None and frame.filename.startswith(_PACKAGE)


def _bool_index(name: str, args) -> bool:
    """x[mask] and x[mask] = v: a boolean index becomes nonzero() on the GPU."""
    if name not in ("aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"):
        return False
    return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in args[1])


class NoHostSync(TorchDispatchMode):
    """Raise HostSyncError on every op a CUDA graph capture cannot hold (see the module doc)."""

    def __init__(self, forbidden=FORBIDDEN):
        super().__init__()
        self.forbidden = frozenset(forbidden)
        self._saved: dict[str, object] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        data_sized = name == "aten::repeat_interleave" and isinstance(args[1] if len(args) > 1 else args[0],
                                                                       torch.Tensor) and kwargs.get("output_size") is None
        if name in self.forbidden or data_sized or _bool_index(name, args):
            raise HostSyncError(f"{func} needs the host (reads a device value or sizes a tensor from data), "
                                f"called from {_caller()}")
        if name in ("aten::_to_copy", "aten::copy_") and self._to_host(name, args, kwargs):
            raise HostSyncError(f"{func}: a device-to-host copy, called from {_caller()}")
        return func(*args, **kwargs)

    @staticmethod
    def _to_host(name, args, kwargs) -> bool:
        if name == "aten::_to_copy":
            dst = kwargs.get("device")
            return dst is not None and torch.device(dst).type == "cpu" and args[0].device.type != "cpu"
        return args[0].device.type == "cpu" and args[1].device.type != "cpu"

    def __enter__(self):
        for method in _HOST_METHODS:
            original = getattr(torch.Tensor, method)
            self._saved[method] = torch.Tensor.__dict__.get(method)  # None: inherited from TensorBase
            setattr(torch.Tensor, method, self._refuse(method, original))
        try:
            return super().__enter__()
        except BaseException:
            self._restore()
            raise

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._restore()

    def _restore(self):
        for method, own in self._saved.items():
            if own is None:
                delattr(torch.Tensor, method)
            else:
                setattr(torch.Tensor, method, own)
        self._saved.clear()

    @staticmethod
    def _refuse(method: str, original):
        def refuse(t, *args, **kwargs):
            # Python scalars that torch itself makes from tensors, outside dsv4's code, are not ours to judge.
            if not _in_dsv4():
                return original(t, *args, **kwargs)
            raise HostSyncError(f"Tensor.{method}() hands a device value to the host, called from {_caller()}")

        refuse.__name__ = method
        return refuse
