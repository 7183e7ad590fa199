"""What a rank's weights need in memory, and what its device has: refuse a load that cannot fit
before reading (or drawing) a byte, naming both figures."""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch

from ..config import ModelConfig
from ..formats import FP4_BLOCK, FP8_BLOCK
from ..layout import local_slice, storage, tensor_specs


class NotEnoughMemoryError(ValueError):
    """A rank's weights do not fit the memory its device has free."""


def weight_bytes(cfg: ModelConfig, rank: int, world: int, dtype: torch.dtype, mtp: bool = False) -> int:
    """Bytes of this rank's weights in the form the model holds them (dsv4.layout.as_memory):
    FP8/FP4 stay packed with their ue8m0 scales, tid2eid int64, fp32 kept, the rest in `dtype`."""
    total = 0
    for spec in tensor_specs(cfg, rank, world, mtp).values():
        shape = list(spec.shape)
        sl = local_slice(spec)
        if sl is not None:
            shape[sl[0]] = sl[2]
        n = math.prod(shape)
        kind = storage(spec, cfg)
        if kind == "fp8":
            total += n + math.ceil(shape[0] / FP8_BLOCK) * math.ceil(shape[1] / FP8_BLOCK)
        elif kind == "fp4":
            total += n // 2 + n // FP4_BLOCK
        else:
            total += n * {"int": 8, "fp32": 4}.get(kind, dtype.itemsize)
    return total


def available_bytes(device: torch.device) -> tuple[int, str]:
    """(bytes free, where the figure comes from) on `device`: CUDA's free memory, or the host RAM
    this process may still take (MemAvailable, capped by a cgroup memory limit)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0], f"free on {device}"
    free, what = _meminfo_available(), "available RAM"
    limit = _cgroup_room()
    if limit is not None and limit < free:
        free, what = limit, "left under this cgroup's memory limit"
    return free, what


def check_fits(cfg: ModelConfig, rank: int, world: int, device, dtype: torch.dtype, source: str,
               mtp: bool = False) -> None:
    """Raise NotEnoughMemoryError when the weights cannot fit (the estimate counts weights only: states
    and activations come on top). CPU ranks share one host's RAM: there
    all ranks' weights count."""
    device = torch.device(device)
    need = sum(weight_bytes(cfg, r, world, dtype, mtp) for r in range(world)) if device.type == "cpu" \
        else weight_bytes(cfg, rank, world, dtype, mtp)
    free, what = available_bytes(device)
    if need > free:
        who = f"the weights of {world} CPU ranks" if device.type == "cpu" and world > 1 else \
            f"rank {rank}'s weights" if world > 1 else "its weights"
        raise NotEnoughMemoryError(f"{source}: {who} need {_gib(need)} ({str(dtype).removeprefix('torch.')} "
                                   f"on {device}), {_gib(free)} {what}")


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _meminfo_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _cgroup_room() -> int | None:
    """The memory limit of this process's cgroup less its use (v2, else v1); None without a limit."""
    root = Path("/sys/fs/cgroup")
    for limit_file, used_file in ((root / "memory.max", root / "memory.current"),
                                  (root / "memory/memory.limit_in_bytes", root / "memory/memory.usage_in_bytes")):
        try:
            limit = limit_file.read_text().strip()
            if limit == "max" or int(limit) >= 2**62:  # no limit (v1 spells it as a huge number)
                return None
            return max(0, int(limit) - int(used_file.read_text()))
        except (OSError, ValueError):
            continue
    return None
