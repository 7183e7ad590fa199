"""Write a random-weight checkpoint directory in the official DeepSeek-V4 format.

config.json, model-0000i-of-0000N.safetensors + model.safetensors.index.json, tokenizer.json,
tokenizer_config.json, generation_config.json. Values are those of `random_weights` (see init.py), so
the same (cfg, seed, quant) gives byte-identical files. Tensors are drawn one at a time and written a
shard at a time; the directory appears atomically, complete or not at all.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from safetensors.torch import save_file

from ..config import FP8_QUANTIZATION, ModelConfig
from ..formats import FP4_BLOCK, FP8_BLOCK
from ..layout import scale_name, storage, tensor_specs
from ..tokenizer import build_tokenizer, save_tokenizer
from .init import stored
from .load import INDEX

QUANTS = ("none", "fp8")


def written_config(cfg: ModelConfig, quant: str) -> ModelConfig:
    """The config a checkpoint of this quant mode carries."""
    if quant not in QUANTS:
        raise ValueError(f"quant={quant!r}: allowed {list(QUANTS)}")
    if quant == "fp8":
        return cfg.replace(quantization_config=dict(FP8_QUANTIZATION), expert_dtype="fp4")
    return cfg.replace(quantization_config=None, expert_dtype="bf16")


def _nbytes(shape, kind: str) -> int:
    n = 1
    for d in shape:
        n *= d
    if kind == "fp8":
        return n + -(-shape[0] // FP8_BLOCK) * -(-shape[1] // FP8_BLOCK)
    if kind == "fp4":
        return n // 2 + n // FP4_BLOCK
    return n * {"bf16": 2, "fp32": 4, "int": 4}[kind]


def _plan(cfg: ModelConfig, max_shard_bytes: int, mtp: bool = False) -> list[list[str]]:
    """Tensor names per shard, in layout order; a weight and its scale share a shard."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, spec in tensor_specs(cfg, mtp=mtp).items():
        n = _nbytes(spec.shape, storage(spec, cfg))
        if shards[-1] and size + n > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    return shards


def _write(cfg: ModelConfig, out: Path, seed: int, max_shard_bytes: int, device, mtp: bool = False) -> None:
    specs = tensor_specs(cfg, mtp=mtp)
    plan = _plan(cfg, max_shard_bytes, mtp)
    weight_map: dict[str, str] = {}
    total = 0
    for i, names in enumerate(plan):
        fname = f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors"
        tensors = {}
        for name in names:
            data, scale, _, _ = stored(name, specs[name], cfg, seed, device)
            tensors[name] = data.contiguous().cpu()
            if scale is not None:
                tensors[scale_name(name)] = scale.contiguous().cpu()
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        for k, t in tensors.items():
            weight_map[k] = fname
            total += t.nbytes
        del tensors
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
    gen = {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "do_sample": True,
           "temperature": 1.0, "top_p": 1.0}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    tok = build_tokenizer(cfg.vocab_size, cfg.bos_token_id, cfg.eos_token_id)
    save_tokenizer(tok, out, model_max_length=cfg.max_position_embeddings)


def synth(cfg: ModelConfig, out_dir, seed: int = 0, quant: str = "none", *,
          max_shard_bytes: int = 2 * 10**9, overwrite: bool = False, device="cpu", mtp: bool = False) -> Path:
    """Write the checkpoint of (cfg, seed, quant) to out_dir and return its path; with `mtp` its MTP layers too
    (`mtp.J.*`, as the official release holds them; the main model's tensors are the same bytes either way).

    quant "fp8": FP8 dense linears + FP4 routed experts (the official release); "none": bf16 linears.
    An existing non-empty out_dir is an error unless overwrite=True (then it is replaced atomically).
    `device` only says where values are drawn ("cuda" is much faster for big configs); the files are
    the same bytes either way.
    """
    wcfg = written_config(cfg, quant)
    out = Path(out_dir)
    if out.exists() and not overwrite and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} already exists and is not empty (pass overwrite=True to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    # Same parent: the final rename stays on one filesystem, hence atomic.
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        _write(wcfg, tmp, seed, max_shard_bytes, device, mtp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private
        if out.exists() or out.is_symlink():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
            os.replace(out, old / "x")
            try:
                os.replace(tmp, out)
            except BaseException:
                os.replace(old / "x", out)
                raise
            finally:
                shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
