"""Random weights in the official layout, generated straight into a rank's slice on any device.

Every value is a pure function of (seed, tensor name, element index): a splitmix64 hash computed with
int64 tensor ops, so it is bit-identical on CPU and GPU and a rank's slice equals the same slice of the
world-1 tensor (a 2-rank random model is the 1-rank random model, split). `synth` writes exactly these
values, so `load_weights(synth(cfg, seed=s))` equals `random_weights(cfg, seed=s)`.

Quantised tensors are drawn directly as codes: FP8 bytes with a sign, three mantissa bits and one of four
exponents, FP4 bytes as two uniform nibbles, each with a random power-of-two block scale chosen so the
weight's standard deviation is about the target. Float tensors are uniform with the target mean and std.

Targets keep activations finite in fp32 and bf16 through every layer: linears std 1/sqrt(fan_in)
(0.5/sqrt(fan_in) for the output projections wo_b and w2), embedding std 1, norms 1 +- 0.05,
mHC fn std 0.1/sqrt(fan_in) (logits ~0.1: token-dependent but near the base), sinks and ape std 0.5.
"""

from __future__ import annotations

import hashlib
import math
import re

import torch

from ..config import ModelConfig
from ..formats import FP4_BLOCK, FP4_VALUES, FP8_BLOCK, QWeight
from ..layout import Spec, as_memory, check_rank, local_slice, storage, tensor_specs

_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


def _i64(x: int) -> int:
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >> 63 else x


def tensor_key(seed: int, name: str) -> int:
    """A stable 64-bit key per (seed, tensor); Python's hash() changes between processes."""
    return int.from_bytes(hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=8).digest(), "little", signed=True)


def _hash(key, idx: torch.Tensor) -> torch.Tensor:
    """splitmix64 output number idx of the stream seeded by key (int or int64 tensor broadcasting with idx).

    int64 arithmetic wraps; right shifts are masked to act as logical shifts. Consumes idx.
    """
    z = idx.mul_(_i64(_GOLDEN))
    if isinstance(key, torch.Tensor):
        z = z + (key + _i64(_GOLDEN))
    else:
        z.add_(_i64(key + _GOLDEN))
    for shift, mult in ((30, _M1), (27, _M2), (31, None)):
        t = z >> shift
        z ^= t.bitwise_and_((1 << (64 - shift)) - 1)
        if mult is not None:
            z.mul_(_i64(mult))
    return z


def _index(rows: range, cols: range, width: int, device) -> torch.Tensor:
    r = torch.arange(rows.start, rows.stop, dtype=torch.int64, device=device)
    c = torch.arange(cols.start, cols.stop, dtype=torch.int64, device=device)
    return r[:, None] * width + c[None, :]


def _draw(key, rows: range, cols: range, width: int, view: torch.dtype, device) -> torch.Tensor:
    """Random uint8 or int32 words for the [rows, cols] part of a [*, width] matrix of them.

    One hash gives 8 bytes or 2 int32 (little-endian on CPU and GPU alike), so element j of a row
    is part j % per of hash j // per whatever the slice.
    """
    per = 8 // view.itemsize
    w0, w1 = cols.start // per, -(-cols.stop // per)
    h = _hash(key, _index(rows, range(w0, w1), -(-width // per), device))
    return h.view(view)[..., cols.start - per * w0: cols.stop - per * w0]


def _unit(words: torch.Tensor) -> torch.Tensor:
    """int32 words -> uniform [0, 1) float32, exact 24-bit values."""
    return ((words >> 8) & 0xFFFFFF).to(torch.float32) * 2.0 ** -24


_CHUNK = 1 << 24  # hashes per draw: bounds the int64 temporaries to 128 MiB


def _chunked(make, rows: range, hashes_per_row: int) -> torch.Tensor:
    """make(rows) over row chunks, concatenated along the row dim (-2)."""
    step = max(1, _CHUNK // max(hashes_per_row, 1))
    if len(rows) <= step:
        return make(rows)
    return torch.cat([make(range(r, min(r + step, rows.stop))) for r in range(rows.start, rows.stop, step)], -2)


# ---------------------------------------------------------------------------
# Target statistics
# ---------------------------------------------------------------------------


def target(name: str, spec: Spec) -> tuple[float, float]:
    """(mean, std) of a tensor's values."""
    fan_in = spec.shape[-1]
    if spec.kind == "fp32":
        if name.endswith("norm.weight"):
            return 1.0, 0.05
        if re.search(r"hc_\w+_fn$", name):
            return 0.0, 0.1 / math.sqrt(fan_in)
        if re.search(r"hc_\w+_scale$", name):
            return 0.75, 0.25 / math.sqrt(3)  # uniform [0.5, 1)
        if re.search(r"hc_\w+_base$", name):
            return 0.0, 0.1
        if name.endswith("gate.bias"):
            return 0.0, 0.05
        return 0.0, 0.5  # attn_sink, ape
    if name == "embed.weight":
        return 0.0, 1.0
    out_proj = name.endswith(("wo_b.weight", "w2.weight"))
    return 0.0, (0.5 if out_proj else 1.0) / math.sqrt(fan_in)


def _codes_rms(values) -> float:
    return math.sqrt(sum(v * v for v in values) / len(values))


# FP8 codes: sign, exponent field 5..8 (magnitudes 0.25 .. 3.75), any mantissa.
_FP8_EXP0 = 5
_FP8_RMS = _codes_rms([2.0 ** (e - 7) * (1 + m / 8) for e in range(5, 9) for m in range(8)])
_FP4_RMS = _codes_rms(FP4_VALUES)


def _scale_exponents(key, rows: range, cols: range, width: int, std: float, rms: float, device):
    """Random power-of-two block scales, 2**e0 or 2**(e0-1), mixed so the mean variance is std**2."""
    e0 = math.ceil(math.log2(std / rms))
    # Variance with a fraction p of half scales: (2**e0 * rms)**2 * (1 - 0.75 p).
    p = (1 - (std / (2.0 ** e0 * rms)) ** 2) / 0.75
    u = _unit(_draw(key, rows, cols, width, torch.int32, device))
    return (e0 - (u < p).to(torch.int32) + 127).to(torch.uint8).view(torch.float8_e8m0fnu)


def _ranges(spec: Spec) -> tuple[int, range, range]:
    """(full width, local rows, local cols) of a spec viewed as 2-D (1-D tensors are one row)."""
    shape = spec.shape if len(spec.shape) == 2 else (1, spec.shape[0])
    rows, cols = range(shape[0]), range(shape[1])
    sl = local_slice(spec)
    if sl is not None:
        dim, start, n = sl
        if len(spec.shape) == 1 or dim == 1:
            cols = range(start, start + n)
        else:
            rows = range(start, start + n)
    return shape[1], rows, cols


def _blocks(r: range, size: int) -> range:
    return range(r.start // size, -(-r.stop // size))


def stored(name: str, spec: Spec, cfg: ModelConfig, seed: int, device="cpu", key=None):
    """The tensor as a checkpoint stores it, restricted to this rank's slice.

    Returns (data, scale or None, row0, col0). `key` (int64 [E, 1, 1]) draws a stack of same-shaped
    tensors (the experts of one layer) in one go; the default is this tensor's own key.
    """
    kind = storage(spec, cfg)
    key = tensor_key(seed, name) if key is None else key
    batch = key.numel() if isinstance(key, torch.Tensor) else 1
    skey = key + 1 if isinstance(key, torch.Tensor) else _i64(key + 1)
    width, rows, cols = _ranges(spec)
    if kind == "int":
        # Each row: num_experts_per_tok distinct experts, the first k of a random permutation.
        k, n = spec.shape[1], cfg.n_routed_experts

        def make(rr):
            h = _hash(key, _index(rr, range(n), n, device))
            return torch.argsort(h, dim=-1, stable=True)[..., :k].to(torch.int32)

        return _chunked(make, rows, batch * n).contiguous(), None, 0, 0
    mean, std = target(name, spec)
    if kind == "fp8":
        def make(rr):
            b = _draw(key, rr, cols, width, torch.uint8, device)
            return (b & 0x87) | ((((b >> 3) & 3) + _FP8_EXP0) << 3)

        code = _chunked(make, rows, batch * len(cols) // 8)
        scale = _scale_exponents(skey, _blocks(rows, FP8_BLOCK), _blocks(cols, FP8_BLOCK),
                                 -(-width // FP8_BLOCK), std, _FP8_RMS, device)
        return code.view(torch.float8_e4m3fn), scale, rows.start, cols.start
    if kind == "fp4":
        if cols.start % FP4_BLOCK or len(cols) % FP4_BLOCK:
            raise ValueError(f"{name}: an FP4 slice must cover whole {FP4_BLOCK}-column groups")
        packed = range(cols.start // 2, cols.stop // 2)
        data = _chunked(lambda rr: _draw(key, rr, packed, width // 2, torch.uint8, device), rows,
                        batch * len(packed) // 8)
        scale = _scale_exponents(skey, rows, _blocks(cols, FP4_BLOCK), width // FP4_BLOCK, std, _FP4_RMS, device)
        return data.view(torch.int8), scale, rows.start, cols.start
    out_dtype = torch.bfloat16 if kind == "bf16" else torch.float32

    def make(rr):
        u = _unit(_draw(key, rr, cols, width, torch.int32, device))
        return u.mul_(2 * std * math.sqrt(3)).add_(mean - std * math.sqrt(3)).to(out_dtype)

    x = _chunked(make, rows, batch * len(cols) // 2)
    return (x.reshape(*x.shape[:-2], len(cols)) if len(spec.shape) == 1 else x), None, 0, 0


def random_weights(cfg: ModelConfig, *, rank: int = 0, world: int = 1, device="cpu",
                   dtype: torch.dtype = torch.float32, seed: int = 0,
                   mtp: bool = False) -> dict[str, torch.Tensor | QWeight]:
    """This rank's weights, in the form `load_weights` returns, drawn on `device` without touching disk (with
    `mtp`, the MTP layers' too: each tensor's values depend on its name and the seed alone, so the main model's
    are the same either way)."""
    check_rank(cfg, rank, world)
    specs = tensor_specs(cfg, rank, world, mtp)
    out: dict[str, torch.Tensor | QWeight] = {}
    # One draw per (layer, w1|w2|w3) for all local experts: thousands of experts, a few kernels each.
    groups: dict[str, list[str]] = {}
    for name, spec in specs.items():
        if spec.expert is not None:
            groups.setdefault(re.sub(r"\.experts\.\d+\.", ".experts.*.", name), []).append(name)
    done = set()
    with torch.no_grad():
        for name, spec in specs.items():
            if name in done:
                continue
            if spec.expert is None:
                data, scale, r0, c0 = stored(name, spec, cfg, seed, device)
                out[name] = as_memory(name, storage(spec, cfg), data, scale, r0, c0, device, dtype)
                continue
            names = groups[re.sub(r"\.experts\.\d+\.", ".experts.*.", name)]
            keys = torch.tensor([tensor_key(seed, n) for n in names], dtype=torch.int64, device=device)
            data, scale, r0, c0 = stored(name, spec, cfg, seed, device, key=keys.view(-1, 1, 1))
            kind = storage(spec, cfg)
            if kind == "bf16":
                data = data.to(dtype)  # convert the stack once, not per expert
            for j, n in enumerate(names):
                out[n] = as_memory(n, kind, data[j], None if scale is None else scale[j], r0, c0, device, dtype)
                done.add(n)
    return {name: out[name] for name in specs}
