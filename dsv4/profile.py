"""The phases of a step, marked for a profile (dsv4.measure takes the breakdown).

`phase(name)` marks a part of the step (attention, compressor + indexer, moe, mhc,
collective, head, sampler, commit). It is free unless a breakdown is being taken
(`marking()`): then it is a profiler range.
"""

from __future__ import annotations

import contextlib

import torch

PHASES = ("mhc", "attention", "compressor", "collective", "moe", "head", "sampler", "commit")
PREFIX = "dsv4::"
_on = False


def phase(name: str):
    return torch.profiler.record_function(PREFIX + name) if _on else contextlib.nullcontext()


@contextlib.contextmanager
def marking():
    global _on
    _on = True
    try:
        yield
    finally:
        _on = False
