"""The phases of a step, marked for a profile (dsv4.measure takes the breakdown).

`phase(name)` marks a part of the step (attention, compressor, indexer, moe, mhc, collective,
head, sampler, commit). It is free unless a breakdown is being taken:

* `marking()`: each phase is a profiler range (torch.profiler.record_function);
* `timing(device)`: each phase's enter and exit append (stamp, name, "enter" | "exit") to the
  log it yields. On CUDA a stamp is a timing event recorded on the current stream, created
  external, so that a stream capture inserts an event-record node into the graph and every
  replay re-records it; on CPU (a synchronous step) it is time.perf_counter().
"""

from __future__ import annotations

import contextlib
import time

import torch

PHASES = ("mhc", "attention", "compressor", "indexer", "collective", "moe", "head", "sampler", "commit")
PREFIX = "dsv4::"
ENTER, EXIT = "enter", "exit"
_FREE = contextlib.nullcontext()  # reusable: the unmarked phase allocates nothing
_on = False
_log: list | None = None
_stamp = time.perf_counter


def phase(name: str):
    if _log is not None:
        return _Timed(name)
    return torch.profiler.record_function(PREFIX + name) if _on else _FREE


class _Timed:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        _log.append((_stamp(), self.name, ENTER))

    def __exit__(self, *exc):
        _log.append((_stamp(), self.name, EXIT))


@contextlib.contextmanager
def marking():
    global _on
    _on = True
    try:
        yield
    finally:
        _on = False


@contextlib.contextmanager
def timing(device):
    """While inside, phases append their enter and exit stamps to the (new) list yielded."""
    global _log, _stamp
    if _log is not None:
        raise RuntimeError("dsv4.profile.timing does not nest")
    log: list = []
    _stamp, _log = clock(device), log
    try:
        yield log
    finally:
        _log, _stamp = None, time.perf_counter


def clock(device):
    """The stamp of `device`: a recorded CUDA timing event (external: a node when captured), or perf_counter."""
    if torch.device(device).type != "cuda":
        return time.perf_counter
    try:
        torch.cuda.Event(enable_timing=True, external=True)
    except TypeError as e:
        raise RuntimeError(f"torch {torch.__version__}: torch.cuda.Event takes no external=True, without which a "
                           "captured graph holds no event nodes to time its phases (a newer torch has it)") from e
    return _event


def _event():
    e = torch.cuda.Event(enable_timing=True, external=True)
    e.record()
    return e


def elapsed_us(a, b) -> float:
    """Microseconds from stamp a to stamp b (both of one clock, b's work complete)."""
    if isinstance(a, float):
        return (b - a) * 1e6
    return a.elapsed_time(b) * 1e3
