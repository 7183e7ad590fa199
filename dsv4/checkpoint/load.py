"""Load an official DeepSeek-V4 checkpoint directory: validate it from the headers, then read a rank's slices.

Every problem raises `CheckpointError` naming the tensor and the file, before any tensor data is read
(tid2eid values, the one check that needs data, are read and checked before everything else); a rank
whose weights cannot fit its device's free memory raises `NotEnoughMemoryError` before reading too.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from pathlib import Path

import torch
from safetensors import safe_open

from ..config import ConfigError, ModelConfig
from ..formats import FP4_BLOCK, FP8_BLOCK, QWeight
from ..layout import Spec, as_memory, check_rank, local_slice, scale_name, storage, tensor_specs
from .memory import check_fits

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"

_FLOATS = {"F32", "BF16", "F16"}  # dense tensors load in any float width: they become `dtype` anyway
_SCALES = {"F8_E8M0", "F32"}  # ue8m0 scales; some releases keep them in a float32 container
_DTYPES = {"fp8": {"F8_E4M3"}, "fp4": {"I8", "U8"}, "bf16": _FLOATS, "fp32": _FLOATS, "int": {"I32", "I64"}}


class CheckpointError(ValueError):
    """A checkpoint directory does not hold what its config says."""


def _err(file, name: str | None, msg: str) -> CheckpointError:
    return CheckpointError(f"{file}: " + (f"tensor {name!r}: " if name else "") + msg)


MAX_HEADER = 100_000_000  # safetensors' own limit on the JSON header


def _header(file: Path) -> dict[str, tuple[str, list[int]]]:
    """name -> (dtype, shape) from a shard's header, after checking the file holds every byte it promises."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as f:
            prefix = f.read(8)
            n = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else None
            raw = f.read(n) if n is not None and n <= min(size - 8, MAX_HEADER) else None
    except OSError as e:
        raise _err(file, None, f"cannot read it ({e.strerror or e})") from None
    if n is None:
        raise _err(file, None, f"truncated: {size} bytes, too short for a safetensors header")
    if raw is None:  # random bytes read as a length: never allocate it
        raise _err(file, None, f"not a safetensors file: its first 8 bytes give a header of {n} bytes "
                               f"in a file of {size}")
    try:
        head = json.loads(raw)
    except ValueError:
        raise _err(file, None, "not a safetensors file: its header is not JSON") from None
    entries = {k: v for k, v in head.items() if k != "__metadata__"} if isinstance(head, dict) else None
    if entries is None or not all(_entry_ok(v) for v in entries.values()):
        raise _err(file, None, "not a safetensors file: its header is not a table of tensors "
                               "(dtype, shape, data_offsets)")
    need = 8 + n + max((v["data_offsets"][1] for v in entries.values()), default=0)
    if need > size:
        raise _err(file, None, f"truncated: its header promises {need} bytes, the file has {size}")
    return {k: (v["dtype"], v["shape"]) for k, v in entries.items()}


def _entry_ok(v) -> bool:
    return (isinstance(v, dict) and isinstance(v.get("dtype"), str) and isinstance(v.get("shape"), list)
            and all(isinstance(d, int) and d >= 0 for d in v["shape"])
            and isinstance(v.get("data_offsets"), list) and len(v["data_offsets"]) == 2
            and all(isinstance(o, int) for o in v["data_offsets"]) and 0 <= v["data_offsets"][0] <= v["data_offsets"][1])


def _expected_shapes(spec: Spec, kind: str) -> tuple[list[int], list[int] | None]:
    shape = list(spec.shape)
    if kind == "fp8":
        return shape, [math.ceil(shape[0] / FP8_BLOCK), math.ceil(shape[1] / FP8_BLOCK)]
    if kind == "fp4":
        return [shape[0], shape[1] // 2], [shape[0], shape[1] // FP4_BLOCK]
    return shape, None


def _locate(path: Path, mtp: bool = False) -> tuple[dict[str, Path], Path]:
    """name -> shard file (mtp.* dropped unless `mtp`), and the file that lists them (index or single file)."""
    index = path / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as e:
            raise _err(index, None, f"not a valid index ({e!r})") from None
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise _err(index, None, "not a valid index (weight_map is not a table of tensor name -> file)")
        where = {}
        for name, file in weight_map.items():
            if name.startswith("mtp.") and not mtp:
                continue
            if not (path / file).is_file():
                raise _err(path / file, name, f"listed in {INDEX} but the shard file does not exist")
            where[name] = path / file
        return where, index
    single = path / SINGLE
    if single.is_file():
        return {name: single for name in _header(single) if mtp or not name.startswith("mtp.")}, single
    raise CheckpointError(f"{path}: no {INDEX} and no {SINGLE}")


def _validate(cfg: ModelConfig, where: dict[str, Path], listing: Path, mtp: bool = False) -> None:
    headers = {f: _header(f) for f in sorted(set(where.values()))}
    full = tensor_specs(cfg, mtp=mtp)
    scales = {scale_name(n): n for n, s in full.items() if storage(s, cfg) in ("fp8", "fp4")}
    if mtp and not any(name.startswith("mtp.") for name in where):
        raise _err(listing, None, f"no MTP layer (mtp.0.*; config num_nextn_predict_layers "
                                  f"{cfg.num_nextn_predict_layers}): load it without mtp")
    for file, head in headers.items():
        for name in head:
            if not (name in full or name in scales or (name.startswith("mtp.") and not mtp)):
                why = "unexpected tensor: not part of this config's layout"
                if name.startswith("mtp.") and ".compressor." in name:
                    why += " (an MTP layer with a compressor: dsv4 runs sliding-window MTP layers, as Flash's)"
                raise _err(file, name, why)

    def entry(name: str, owner: str) -> tuple[Path, str, list[int]]:
        if name not in where:
            what = "missing" if name == owner else f"missing scale of quantised weight {owner!r}"
            raise _err(listing, name, what)
        file = where[name]
        if name not in headers[file]:
            raise _err(file, name, f"missing from the shard (listed there by {listing.name})")
        dtype, shape = headers[file][name]
        return file, dtype, shape

    for name, spec in full.items():
        kind = storage(spec, cfg)
        want, want_scale = _expected_shapes(spec, kind)
        file, dtype, shape = entry(name, name)
        if dtype not in _DTYPES[kind]:
            raise _err(file, name, f"dtype {dtype}, expected {' or '.join(sorted(_DTYPES[kind]))} "
                                   f"({kind} in this {'quantised' if cfg.quantized else 'plain'} checkpoint)")
        if shape != want:
            raise _err(file, name, f"shape {shape}, expected {want}")
        if want_scale is not None:
            sname = scale_name(name)
            sfile, sdtype, sshape = entry(sname, name)
            if sdtype not in _SCALES:
                raise _err(sfile, sname, f"dtype {sdtype}, expected F8_E8M0 (a ue8m0 scale; F32 is read too)")
            if sshape != want_scale:
                raise _err(sfile, sname, f"shape {sshape}, expected {want_scale}")


def _read(handle, name: str, spec: Spec, kind: str) -> tuple[torch.Tensor, torch.Tensor | None, int, int]:
    """This rank's slice of a tensor (and of its scale grid), read from disk without the rest."""
    sl = local_slice(spec)
    part = handle[name].get_slice(name)
    if sl is None:
        data = part[:]
        scale = handle[scale_name(name)].get_tensor(scale_name(name)) if kind in ("fp8", "fp4") else None
        return data, scale, 0, 0
    dim, start, n = sl
    if kind not in ("fp8", "fp4"):
        idx = [slice(None)] * len(spec.shape)
        idx[dim] = slice(start, start + n)
        return part[tuple(idx)], None, 0, 0
    block = (FP8_BLOCK, FP8_BLOCK) if kind == "fp8" else (1, FP4_BLOCK)
    packing = 2 if kind == "fp4" and dim == 1 else 1
    if start % packing or n % packing:
        raise _err(handle.where[name], name, "an FP4 slice must start and end on a byte")
    idx = [slice(None), slice(None)]
    idx[dim] = slice(start // packing, (start + n) // packing)
    sidx = [slice(None), slice(None)]
    sidx[dim] = slice(start // block[dim], math.ceil((start + n) / block[dim]))
    scale = handle[scale_name(name)].get_slice(scale_name(name))[tuple(sidx)]
    row0, col0 = (start, 0) if dim == 0 else (0, start)
    return part[tuple(idx)], scale, row0, col0


class _Handles:
    """name -> open safe_open handle of its file, one handle per file."""

    def __init__(self, where: dict[str, Path]):
        self._open: dict[Path, object] = {}
        self.where = where

    def __getitem__(self, name):
        file = self.where[name]
        if file not in self._open:
            self._open[file] = safe_open(str(file), framework="pt", device="cpu")
        return self._open[file]


def _progress(path: Path, total: int, rank: int):
    """A bar over the tensors read, naming the shard; shown by rank 0 on a terminal only."""
    from tqdm import tqdm

    return tqdm(total=total, desc=f"loading {path.name}", unit="tensor", leave=False,
                disable=rank != 0 or not sys.stderr.isatty())


def load_weights(path, cfg: ModelConfig | None = None, *, rank: int = 0, world: int = 1, device="cpu",
                 dtype: torch.dtype = torch.float32,
                 mtp: bool = False) -> tuple[ModelConfig, dict[str, torch.Tensor | QWeight]]:
    """(cfg, this rank's weights; with `mtp` the MTP layers' too). Quantised weights stay quantised (QWeight); see
    `as_memory`."""
    path = Path(path)
    if cfg is None:
        if not (path / "config.json").is_file():
            raise CheckpointError(f"{path / 'config.json'}: no such file (a checkpoint needs its config.json)")
        try:
            cfg = ModelConfig.from_json(path / "config.json")
        except ConfigError as e:
            raise CheckpointError(str(e)) from None
    check_rank(cfg, rank, world)
    where, listing = _locate(path, mtp)
    _validate(cfg, where, listing, mtp)
    check_fits(cfg, rank, world, device, dtype, str(path), mtp)

    specs = tensor_specs(cfg, rank, world, mtp)
    handles = _Handles(where)
    out: dict[str, torch.Tensor | QWeight] = {}
    # tid2eid first: its values are the one check that needs data; then shard by shard.
    order = sorted(specs, key=lambda n: (storage(specs[n], cfg) != "int", str(where[n])))
    with torch.no_grad(), _progress(path, len(order), rank) as bar:
        for name in order:
            bar.set_postfix_str(where[name].name, refresh=False)
            bar.update()
            spec = specs[name]
            kind = storage(spec, cfg)
            data, scale, row0, col0 = _read(handles, name, spec, kind)
            if kind == "int":
                lo, hi = int(data.min()), int(data.max())
                if lo < 0 or hi >= cfg.n_routed_experts:
                    raise _err(where[name], name, f"expert ids in [{lo}, {hi}], expected within "
                                                  f"[0, {cfg.n_routed_experts})")
            out[name] = as_memory(name, kind, data, scale, row0, col0, device, dtype)
    return cfg, {name: out[name] for name in specs}
