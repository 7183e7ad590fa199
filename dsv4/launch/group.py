"""Process groups: the backend and device of a rank, its share of the CPU cores, joining and
leaving a group (bounded), and joining torchrun's."""

from __future__ import annotations

import datetime
import os
import threading

import torch
import torch.distributed as dist

from ..engine import build, placement

DEFAULT_TIMEOUT = 120.0  # seconds a collective or a rank's answer may take before the driver gives up


def backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def rank_device(device: torch.device, rank: int) -> torch.device:
    if device.type == "cuda":
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return device


def share_cores(device: torch.device, world: int) -> int:
    """Cap this rank's intra-op threads; returns the count before, for close() to put back."""
    before = torch.get_num_threads()
    # CPU ranks share the host's cores; oversubscribed (and spinning in OpenMP) they crawl.
    if device.type == "cpu":
        torch.set_num_threads(max(1, min(before, (os.cpu_count() or 1) // world)))
    return before


def init_group(store, backend: str, rank: int, world: int, timeout: float):
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout))
    return dist.group.WORLD


def leave_group(limit: float) -> bool:
    """destroy_process_group, bounded: NCCL's teardown waits for every rank, and a dead one never comes."""
    if not dist.is_initialized():
        return True
    t = threading.Thread(target=dist.destroy_process_group, daemon=True, name="dsv4-leave")
    t.start()
    t.join(limit)
    return not t.is_alive()


def from_torchrun(path_or_preset, device=None, timeout: float = DEFAULT_TIMEOUT, **kw):
    """Inside a torchrun process: join the group from the environment and return this rank's Model."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise RuntimeError("from_torchrun needs RANK and WORLD_SIZE in the environment (run under torchrun)")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    if not dist.is_initialized():
        dist.init_process_group(backend(device), timeout=datetime.timedelta(seconds=timeout))
    device, dtype = placement(device, kw.pop("dtype", None))
    return build(path_or_preset, device, dtype, rank=rank, world=world, group=dist.group.WORLD, **kw)
