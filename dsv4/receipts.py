"""Receipts: what a gate or a benchmark measured, and under which conditions, one record a line.

A record is its kind, a space and one JSON object (`REPLAY_PROTOCOL {"prime_tokens":256,...}`), as
the seed gate prints them, so receipts stay comparable with it and parse with one split. Where a
record says under which conditions it was measured, `provenance()` fills that in (commit, torch,
device, kernel mode, preset): nothing in a receipt is typed by hand. The gate, `dsv4 bench` and
every script in benchmarks/ write through here.
"""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path

import torch

from . import kernels
from .layout import CONFIG as layout_config


@functools.cache
def commit_id() -> str:
    """The checkout's short commit, or "unknown" (an installed copy has no git)."""
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True,
                                       cwd=Path(__file__).resolve().parent, stderr=subprocess.DEVNULL).strip()
    except Exception:  # noqa: BLE001 - no git, or not a checkout
        return "unknown"


def provenance(device=None, preset: str | None = None) -> dict:
    """commit, torch, device, device_name, kernels (DSV4_KERNELS), gemv (the decode GEMVs' kernels), prefill_gemv
    (DSV4_PREFILL_GEMV: a short prefill chunk's, the process's unless set), fuse_qkv
    (DSV4_FUSE_QKV: attention's wq_a and wkv in one linear), fuse_xproj (DSV4_FUSE_XPROJ: the compressors' and
    the indexer's bf16 linears of x in one), pdl (DSV4_PDL: programmatic dependent launch), sampler (DSV4_SAMPLER:
    the draw's method, dsv4.sampler CONFIG; another method, another stream) and preset of a measurement; verify_chunk
    (DSV4_VERIFY_CHUNK: a verify step's rows as one chunk, dsv4.layout) where it is on."""

    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"commit": commit_id(), "torch": torch.__version__, "device": str(device), "device_name": name,
            "kernels": kernels.mode(), "gemv": kernels.gemv(),
            "prefill_gemv": layout_config["prefill_gemv"] or kernels.gemv(),
            "fuse_qkv": layout_config["fuse_qkv"], "fuse_xproj": layout_config["fuse_xproj"], "pdl": kernels.PDL,
            "sampler": kernels.getenv("DSV4_SAMPLER", "inverse"), "preset": preset,
            **({"verify_chunk": True} if layout_config["verify_chunk"] else {})}


class Receipts:
    """Records to stdout and, with `out`, to that file too."""

    def __init__(self, out: str | Path | None = None):
        self.file = open(out, "w") if out else None

    def emit(self, tag: str, record: dict | None = None, **fields):
        self._line(f"{tag} {json.dumps({**(record or {}), **fields}, separators=(',', ':'))}")

    def note(self, text: str):
        """A plain line between records (a PASS summary); parsers skip it."""
        self._line(text)

    def _line(self, line: str):
        print(line, flush=True)
        if self.file:
            self.file.write(line + "\n")
            self.file.flush()

    def close(self):
        if self.file:
            self.file.close()
            self.file = None


def emit(tag: str, record: dict | None = None, **fields):
    """One record to stdout (what a benchmark script prints)."""
    Receipts().emit(tag, record, **fields)


__all__ = ["Receipts", "emit", "provenance", "commit_id"]
