"""Weight containers and the official tensor layout.

Every tensor the model reads is named as in the official DeepSeek-V4 checkpoint
(`layers.N.attn.wq_a.weight`, `layers.N.ffn.experts.E.w1.weight`, `hc_head_fn`, ...).
`tensor_specs(cfg, rank, world)` is the single description of that layout: the
checkpoint writer, the loader and the random initialiser all build from it, and
each builds only the slice of a rank (heads, groups, experts, intermediate rows,
vocab rows) so a rank never materialises what it does not own.

Quantised weights stay quantised in memory (`QWeight`) and are dequantised
where they are used.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import CSA, HASH_MOE, ModelConfig

FP8_BLOCK = 128  # dense linears: 128x128 weight blocks, one ue8m0 scale each
FP4_BLOCK = 32  # routed experts: one ue8m0 scale per 32 inputs (along K)

# E2M1 value of each nibble (sign bit 3).
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


@dataclass
class QWeight:
    """A linear weight [out, in]: dense, FP8 e4m3 with 128x128 block scales, or FP4 e2m1 (two per byte).

    `row0`/`col0` are the offsets of this slice inside the full tensor, so a rank's slice that
    starts inside a scale block still finds its scale.
    """

    data: torch.Tensor
    scale: torch.Tensor | None = None
    fmt: str = "dense"  # "dense" | "fp8" | "fp4"
    row0: int = 0
    col0: int = 0

    @property
    def shape(self) -> tuple[int, int]:
        rows, cols = self.data.shape[-2:]
        return (rows, cols * 2) if self.fmt == "fp4" else (rows, cols)

    def dequant(self, dtype: torch.dtype) -> torch.Tensor:
        if self.fmt == "dense":
            return self.data if self.data.dtype == dtype else self.data.to(dtype)
        rows, cols = self.shape
        br, bc = (FP8_BLOCK, FP8_BLOCK) if self.fmt == "fp8" else (1, FP4_BLOCK)
        if not (self.row0 % br or self.col0 % bc or rows % br or cols % bc):
            return self._dequant_blocks(dtype, br, bc)
        return self._dequant_any(dtype)

    def _dequant_blocks(self, dtype, br: int, bc: int) -> torch.Tensor:
        """Whole scale blocks: one broadcast multiply. Exact in bf16 and fp32 alike (e4m3 and e2m1 values
        times a power of two), so it equals the general path bit for bit."""
        rows, cols = self.shape
        lead = self.data.shape[:-2]
        if self.fmt == "fp8":
            values = self.data.to(dtype)
        else:
            values = unpack_fp4(self.data, dtype)
        blocks = values.view(*lead, rows // br, br, cols // bc, bc)
        scale = self.scale.float().to(dtype)[..., :, None, :, None]
        return (blocks * scale).view(*lead, rows, cols)

    def _dequant_any(self, dtype: torch.dtype) -> torch.Tensor:
        rows, cols = self.shape
        if self.fmt == "fp8":
            values = self.data.float()
            br, bc = FP8_BLOCK, FP8_BLOCK
        else:
            values = unpack_fp4(self.data)
            br, bc = 1, FP4_BLOCK
        scale = self.scale.float()
        scale = scale.repeat_interleave(br, dim=-2)[..., self.row0 % br: self.row0 % br + rows, :]
        scale = scale.repeat_interleave(bc, dim=-1)[..., self.col0 % bc: self.col0 % bc + cols]
        return (values * scale).to(dtype)

    def to(self, device) -> "QWeight":
        return QWeight(self.data.to(device), None if self.scale is None else self.scale.to(device),
                       self.fmt, self.row0, self.col0)

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + (0 if self.scale is None else self.scale.nbytes)


_LUTS: dict[tuple, torch.Tensor] = {}


def unpack_fp4(packed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Two e2m1 values per byte, low nibble first -> `dtype`, twice as wide (one table lookup per byte)."""
    key = (packed.device, dtype)
    lut = _LUTS.get(key)
    if lut is None:  # made once per device: a host->device copy must not happen inside a graph capture
        pairs = [(FP4_VALUES[b & 0xF], FP4_VALUES[b >> 4]) for b in range(256)]
        lut = _LUTS[key] = torch.tensor(pairs, dtype=dtype, device=packed.device)
    u8 = packed.view(torch.uint8)
    both = lut.index_select(0, u8.flatten().long())  # [n, 2]
    return both.view(*packed.shape[:-1], packed.shape[-1] * 2)


# ---------------------------------------------------------------------------
# The layout
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """One checkpoint tensor: its full shape, its storage kind and how ranks split it.

    kind: "linear" (FP8-able dense linear), "expert" (FP4-able), "bf16" (dense linear kept
    bf16 in official checkpoints), "fp32" (norms, mHC, sinks, ape, biases), "int" (tid2eid).
    split: None (replicated) or (dim, parts, index) meaning this rank owns part `index` of
    `parts` equal parts along `dim`.
    """

    shape: tuple[int, ...]
    kind: str
    split: tuple[int, int, int] | None = None
    expert: int | None = None  # routed expert id, for expert-parallel ownership


def expert_range(cfg: ModelConfig, rank: int, world: int) -> range:
    n = cfg.n_routed_experts // world
    return range(rank * n, (rank + 1) * n)


def check_split(cfg: ModelConfig, world: int) -> None:
    """A TP/EP world must divide heads, output groups, experts, shared intermediate and vocab."""
    for name, v in (("num_attention_heads", cfg.num_attention_heads), ("o_groups", cfg.o_groups),
                    ("n_routed_experts", cfg.n_routed_experts),
                    ("moe_intermediate_size", cfg.moe_intermediate_size), ("vocab_size", cfg.vocab_size)):
        if v % world:
            raise ValueError(f"{name}={v} is not divisible by ranks={world}")


def tensor_specs(cfg: ModelConfig, rank: int = 0, world: int = 1) -> dict[str, Spec]:
    """Every tensor of the official checkpoint (MTP layers excluded) that rank `rank` of `world` reads."""
    D, H, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
    hc, g = cfg.hc_mult, cfg.o_groups
    mix = (2 + hc) * hc
    row = (0, world, rank) if world > 1 else None
    col = (1, world, rank) if world > 1 else None
    s: dict[str, Spec] = {
        "embed.weight": Spec((cfg.vocab_size, D), "bf16"),
        "head.weight": Spec((cfg.vocab_size, D), "bf16", row),
        "norm.weight": Spec((D,), "fp32"),
        "hc_head_fn": Spec((hc, hc * D), "fp32"),
        "hc_head_base": Spec((hc,), "fp32"),
        "hc_head_scale": Spec((1,), "fp32"),
    }
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        s[p + "attn_norm.weight"] = Spec((D,), "fp32")
        s[p + "ffn_norm.weight"] = Spec((D,), "fp32")
        for site in ("attn", "ffn"):
            s[p + f"hc_{site}_fn"] = Spec((mix, hc * D), "fp32")
            s[p + f"hc_{site}_base"] = Spec((mix,), "fp32")
            s[p + f"hc_{site}_scale"] = Spec((3,), "fp32")
        a = p + "attn."
        s[a + "wq_a.weight"] = Spec((cfg.q_lora_rank, D), "linear")
        s[a + "q_norm.weight"] = Spec((cfg.q_lora_rank,), "fp32")
        s[a + "wq_b.weight"] = Spec((H * hd, cfg.q_lora_rank), "linear", row)  # by head
        s[a + "wkv.weight"] = Spec((hd, D), "linear")
        s[a + "kv_norm.weight"] = Spec((hd,), "fp32")
        s[a + "wo_a.weight"] = Spec((g * cfg.o_lora_rank, H * hd // g), "linear", row)  # whole groups
        s[a + "wo_b.weight"] = Spec((D, g * cfg.o_lora_rank), "linear", col)
        s[a + "attn_sink"] = Spec((H,), "fp32", row)
        m = cfg.compress_rate(i)
        if m:
            csa = cfg.layer_types[i] == CSA
            width = (2 if csa else 1) * hd  # CSA: two overlapping series Ca | Cb
            s[a + "compressor.wkv.weight"] = Spec((width, D), "bf16")
            s[a + "compressor.wgate.weight"] = Spec((width, D), "bf16")
            s[a + "compressor.ape"] = Spec((m, width), "fp32")
            s[a + "compressor.norm.weight"] = Spec((hd,), "fp32")
            if csa:
                nI, dI = cfg.index_n_heads, cfg.index_head_dim
                s[a + "indexer.wq_b.weight"] = Spec((nI * dI, cfg.q_lora_rank), "linear")
                s[a + "indexer.weights_proj.weight"] = Spec((nI, D), "bf16")
                s[a + "indexer.compressor.wkv.weight"] = Spec((2 * dI, D), "bf16")
                s[a + "indexer.compressor.wgate.weight"] = Spec((2 * dI, D), "bf16")
                s[a + "indexer.compressor.ape"] = Spec((m, 2 * dI), "fp32")
                s[a + "indexer.compressor.norm.weight"] = Spec((dI,), "fp32")
        f = p + "ffn."
        s[f + "gate.weight"] = Spec((cfg.n_routed_experts, D), "bf16")
        if cfg.mlp_layer_types[i] == HASH_MOE:
            s[f + "gate.tid2eid"] = Spec((cfg.vocab_size, cfg.num_experts_per_tok), "int")
        else:
            s[f + "gate.bias"] = Spec((cfg.n_routed_experts,), "fp32")
        I = cfg.moe_intermediate_size
        for e in expert_range(cfg, rank, world):
            x = f + f"experts.{e}."
            s[x + "w1.weight"] = Spec((I, D), "expert", expert=e)
            s[x + "w3.weight"] = Spec((I, D), "expert", expert=e)
            s[x + "w2.weight"] = Spec((D, I), "expert", expert=e)
        if cfg.n_shared_experts:
            s[f + "shared_experts.w1.weight"] = Spec((I, D), "linear", row)
            s[f + "shared_experts.w3.weight"] = Spec((I, D), "linear", row)
            s[f + "shared_experts.w2.weight"] = Spec((D, I), "linear", col)
    return s


def storage(spec: Spec, cfg: ModelConfig) -> str:
    """How a tensor of this kind is stored in a checkpoint of this config: fp8 | fp4 | bf16 | fp32 | int."""
    if spec.kind == "linear":
        return "fp8" if cfg.quantized else "bf16"
    if spec.kind == "expert":
        return {"fp4": "fp4", "fp8": "fp8"}.get(cfg.expert_dtype, "bf16") if cfg.quantized else "bf16"
    return spec.kind


def local_slice(spec: Spec) -> tuple[int, int, int] | None:
    """(dim, start, length) of this rank's part of the full tensor, or None when whole."""
    if spec.split is None:
        return None
    dim, parts, index = spec.split
    n = spec.shape[dim] // parts
    return dim, index * n, n
