"""ModelConfig: the shapes of a DeepSeek-V4 model.

Built from an official / HF `config.json` (legacy keys included) or from a named
preset. Field names follow the HF `DeepseekV4Config` and the paper. A bad value
raises `ConfigError` naming the field and what is allowed.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

SLIDING = "sliding_attention"
CSA = "compressed_sparse_attention"
HCA = "heavily_compressed_attention"
LAYER_TYPES = (SLIDING, CSA, HCA)
HASH_MOE = "hash_moe"
MOE = "moe"
MLP_LAYER_TYPES = (HASH_MOE, MOE)
SCORING_FUNCS = ("sqrtsoftplus", "sigmoid", "softmax")
EXPERT_DTYPES = ("fp4", "fp8", "bf16")

# Legacy `compress_ratios` (official config.json) map a rate to a layer type.
_RATIO_TO_TYPE = {0: SLIDING, 4: CSA, 128: HCA}

# What a config.json must say (one spelling of each group; the official Flash config.json says all):
# left out, each would silently take the Flash value (or, for the grouped ones, a value that differs
# from what HF's DeepseekV4Config reads into the same file).
REQUIRED_KEYS = (
    ("vocab_size",), ("hidden_size",), ("num_hidden_layers",), ("num_attention_heads",), ("head_dim",),
    ("q_lora_rank",), ("o_groups",), ("o_lora_rank",), ("sliding_window",), ("index_n_heads",),
    ("index_head_dim",), ("index_topk",), ("n_routed_experts",), ("num_experts_per_tok",),
    ("n_shared_experts",), ("moe_intermediate_size",), ("scoring_func",), ("routed_scaling_factor",),
    ("swiglu_limit",), ("hc_mult",), ("hc_sinkhorn_iters",), ("hc_eps",), ("rope_theta",),
    ("compress_rope_theta",),
    ("layer_types", "compress_ratios"),  # HF's default schedule starts with two HCA layers, ours two sliding
    ("qk_rope_head_dim", "partial_rotary_factor"),  # HF's default is head_dim / 8, ours 64
    ("rope_scaling", "rope_parameters"),  # HF's default is plain rope, ours Flash's YaRN (null: plain)
)
# Keys a config.json may leave out: each keeps a default that HF's DeepseekV4Config (5.17) has too
# (tests/test_config.py checks it), so both read such a file alike. mlp_layer_types / num_hash_layers:
# 3 hash layers; compress_rates: CSA 4, HCA 128; quantization_config: none (plain weights).
HF_DEFAULT_KEYS = ("max_position_embeddings", "rms_norm_eps", "norm_topk_prob", "tie_word_embeddings",
                   "num_nextn_predict_layers", "num_key_value_heads", "bos_token_id", "eos_token_id")


class ConfigError(ValueError):
    """A config field is missing or has a value dsv4 cannot run."""


@dataclass
class ModelConfig:
    vocab_size: int = 129280
    hidden_size: int = 4096
    num_hidden_layers: int = 43
    num_attention_heads: int = 64
    num_key_value_heads: int = 1
    head_dim: int = 512
    qk_rope_head_dim: int = 64
    q_lora_rank: int = 1024
    o_groups: int = 8
    o_lora_rank: int = 1024
    sliding_window: int = 128
    layer_types: list[str] = field(default_factory=list)
    compress_rates: dict[str, int] = field(default_factory=lambda: {CSA: 4, HCA: 128})
    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 512
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    # YaRN for the compressed layers' rope; None = plain rope there too.
    rope_scaling: dict | None = field(
        default_factory=lambda: {
            "type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
            "beta_fast": 32, "beta_slow": 1,
        }
    )
    max_position_embeddings: int = 1048576
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    n_routed_experts: int = 256
    num_experts_per_tok: int = 6
    n_shared_experts: int = 1
    moe_intermediate_size: int = 2048
    mlp_layer_types: list[str] = field(default_factory=list)
    scoring_func: str = "sqrtsoftplus"
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.5
    swiglu_limit: float = 10.0
    rms_norm_eps: float = 1e-6
    bos_token_id: int = 0
    eos_token_id: int = 1
    num_nextn_predict_layers: int = 1
    tie_word_embeddings: bool = False
    # Storage of the checkpoint: "fp4" routed experts + FP8 dense (official), or plain.
    expert_dtype: str = "fp4"
    quantization_config: dict | None = None

    def __post_init__(self):
        n = self.num_hidden_layers
        if not self.layer_types:
            self.layer_types = [SLIDING] * min(n, 2) + [CSA if i % 2 == 0 else HCA for i in range(max(n - 2, 0))]
            if n > 2:
                self.layer_types[-1] = CSA
        if not self.mlp_layer_types:
            self.mlp_layer_types = [HASH_MOE] * min(n, 3) + [MOE] * max(n - 3, 0)
        self.validate()

    # ---- derived -----------------------------------------------------------
    def compress_rate(self, layer: int) -> int:
        """m for a layer: 0 for sliding-only layers. Layers num_hidden_layers.. are the MTP layers (mtp.0, ...):
        sliding-only, as DeepSeek-V4-Flash's (its compress_ratios' entry past the main layers is 0; dsv4.layout
        refuses a checkpoint whose MTP layer holds a compressor)."""
        if layer >= self.num_hidden_layers:
            return 0
        t = self.layer_types[layer]
        return 0 if t == SLIDING else self.compress_rates[t]

    @property
    def compress_ratios(self) -> list[int]:
        return [self.compress_rate(i) for i in range(self.num_hidden_layers)]

    @property
    def n_hash_layers(self) -> int:
        return sum(t == HASH_MOE for t in self.mlp_layer_types)

    @property
    def quantized(self) -> bool:
        return self.quantization_config is not None

    # ---- validation --------------------------------------------------------
    def validate(self) -> None:
        def need(cond: bool, fieldname: str, allowed: str):
            if not cond:
                raise ConfigError(f"config field {fieldname!r} = {getattr(self, fieldname)!r}: {allowed}")

        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim",
                     "q_lora_rank", "o_groups", "o_lora_rank", "sliding_window", "index_n_heads",
                     "index_head_dim", "index_topk", "hc_mult", "hc_sinkhorn_iters", "n_routed_experts",
                     "num_experts_per_tok", "moe_intermediate_size"):
            v = getattr(self, name)
            need(isinstance(v, int) and not isinstance(v, bool) and v > 0, name, "must be a positive integer")
        need(self.num_key_value_heads == 1, "num_key_value_heads", "DeepSeek-V4 has one shared K=V head: allowed 1")
        need(self.n_shared_experts in (0, 1), "n_shared_experts", "allowed 0 or 1")
        need(isinstance(self.qk_rope_head_dim, int) and 0 < self.qk_rope_head_dim <= self.head_dim
             and self.qk_rope_head_dim % 2 == 0, "qk_rope_head_dim", f"an even integer in (0, head_dim={self.head_dim}]")
        need(self.num_attention_heads % self.o_groups == 0, "o_groups",
             f"must divide num_attention_heads={self.num_attention_heads}")
        need(self.num_experts_per_tok <= self.n_routed_experts, "num_experts_per_tok",
             f"at most n_routed_experts={self.n_routed_experts}")
        need(self.index_head_dim % 2 == 0 and self.qk_rope_head_dim <= self.index_head_dim, "index_head_dim",
             f"an even integer >= qk_rope_head_dim={self.qk_rope_head_dim}")
        need(self.scoring_func in SCORING_FUNCS, "scoring_func", f"allowed {list(SCORING_FUNCS)}")
        need(self.expert_dtype in EXPERT_DTYPES, "expert_dtype", f"allowed {list(EXPERT_DTYPES)}")
        need(isinstance(self.layer_types, list) and len(self.layer_types) == self.num_hidden_layers,
             "layer_types", f"a list of num_hidden_layers={self.num_hidden_layers} entries")
        bad = [t for t in self.layer_types if t not in LAYER_TYPES]
        need(not bad, "layer_types", f"entries allowed {list(LAYER_TYPES)}; got {bad}")
        need(isinstance(self.mlp_layer_types, list) and len(self.mlp_layer_types) == self.num_hidden_layers,
             "mlp_layer_types", f"a list of num_hidden_layers={self.num_hidden_layers} entries")
        bad = [t for t in self.mlp_layer_types if t not in MLP_LAYER_TYPES]
        need(not bad, "mlp_layer_types", f"entries allowed {list(MLP_LAYER_TYPES)}; got {bad}")
        for t in (CSA, HCA):
            r = self.compress_rates.get(t)
            need(isinstance(r, int) and r >= 2, "compress_rates", f"{t} needs an integer rate >= 2")
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("type", self.rope_scaling.get("rope_type"))
            need(kind in ("yarn", "default"), "rope_scaling", "type allowed 'yarn' or 'default'")
            if kind == "yarn":
                for k in ("factor", "original_max_position_embeddings"):
                    need(k in self.rope_scaling, "rope_scaling", f"yarn needs {k!r}")
        if self.quantization_config is not None:
            q = self.quantization_config
            need(q.get("quant_method") == "fp8", "quantization_config", "quant_method allowed 'fp8'")
            need(list(q.get("weight_block_size", [128, 128])) == [128, 128], "quantization_config",
                 "weight_block_size allowed [128, 128]")
            need(q.get("scale_fmt", "ue8m0") == "ue8m0", "quantization_config", "scale_fmt allowed 'ue8m0'")

    # ---- io ----------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        d = dict(d)
        known = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in known and k not in ("layer_types", "compress_rates")}
        if "model_type" in d and d["model_type"] not in ("deepseek_v4",):
            raise ConfigError(f"config field 'model_type' = {d['model_type']!r}: allowed 'deepseek_v4'")
        rates = dict(d.get("compress_rates") or {CSA: 4, HCA: 128})
        if "compress_rate_csa" in d:
            rates[CSA] = d["compress_rate_csa"]
        if "compress_rate_hca" in d:
            rates[HCA] = d["compress_rate_hca"]
        kw["compress_rates"] = rates
        n = d.get("num_hidden_layers", 43)
        if d.get("layer_types"):
            kw["layer_types"] = list(d["layer_types"])[:n]
        elif d.get("compress_ratios") is not None:
            ratios = list(d["compress_ratios"])[:n]
            bad = [r for r in ratios if r not in _RATIO_TO_TYPE]
            if bad:
                raise ConfigError(f"config field 'compress_ratios' has {bad}: allowed 0, 4, 128 "
                                  "(use layer_types + compress_rates for other rates)")
            kw["layer_types"] = [_RATIO_TO_TYPE[r] for r in ratios]
        if d.get("mlp_layer_types"):
            kw["mlp_layer_types"] = list(d["mlp_layer_types"])[:n]
        elif d.get("num_hash_layers") is not None:
            h = d["num_hash_layers"]
            kw["mlp_layer_types"] = [HASH_MOE] * min(n, h) + [MOE] * max(n - h, 0)
        if "partial_rotary_factor" in d and "qk_rope_head_dim" not in d and d["partial_rotary_factor"]:
            kw["qk_rope_head_dim"] = int(d.get("head_dim", 512) * d["partial_rotary_factor"])
        rp = d.get("rope_scaling") or d.get("rope_parameters")
        if isinstance(rp, dict) and isinstance(rp.get("compress"), dict):
            rp = rp["compress"]
        if rp is not None:
            rp = {k: v for k, v in rp.items() if k not in ("rope_theta", "partial_rotary_factor", "attention_factor")}
            if rp.get("type", rp.get("rope_type")) in (None, "default"):
                rp = None
        if "rope_scaling" in d or "rope_parameters" in d:
            kw["rope_scaling"] = rp
        if isinstance(kw.get("eos_token_id"), list):
            kw["eos_token_id"] = kw["eos_token_id"][0]
        for k in ("rope_theta", "compress_rope_theta", "routed_scaling_factor", "swiglu_limit", "hc_eps",
                  "rms_norm_eps"):
            if k in kw:
                kw[k] = float(kw[k])
        try:
            return cls(**kw)
        except TypeError as e:  # pragma: no cover - defensive
            raise ConfigError(str(e)) from None

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelConfig":
        """A config.json: every key of REQUIRED_KEYS present (a missing one is an error naming it and
        the file); the keys of HF_DEFAULT_KEYS may be left out. `from_dict` (code, not files) fills in
        Flash defaults."""
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such config file") from None
        except OSError as e:
            raise ConfigError(f"{path}: cannot read it ({e.strerror or e})") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{path}: not valid JSON (not UTF-8 text)") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(d, dict):
            raise ConfigError(f"{path}: not a JSON object")
        missing = [" or ".join(repr(k) for k in group) for group in REQUIRED_KEYS if not any(k in d for k in group)]
        if d.get("quantization_config") is not None and "expert_dtype" not in d:
            missing.append("'expert_dtype' (a quantised checkpoint's routed experts: fp4 or fp8)")
        if missing:
            raise ConfigError(f"{path}: config key{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                              f"missing (dsv4 takes no silent default for {'them' if len(missing) > 1 else 'it'})")
        try:
            return cls.from_dict(d)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None

    def to_dict(self) -> dict:
        """The config.json dsv4 writes: official legacy keys where they can say it, modern keys otherwise.

        HF's DeepseekV4Config reads both; legacy `compress_ratios` only knows 0/4/128.
        """
        d = {
            "architectures": ["DeepseekV4ForCausalLM"],
            "model_type": "deepseek_v4",
            # HF reads this as its default load dtype; its DeepseekV4 (5.17) crashes on its own
            # fp32-kept modules when loaded bf16, so float32 makes `from_pretrained(dir)` just work.
            "torch_dtype": "float32",
        }
        for f in dataclasses.fields(self):
            if f.name in ("layer_types", "compress_rates", "mlp_layer_types", "quantization_config"):
                continue
            d[f.name] = getattr(self, f.name)
        if self.compress_rates == {CSA: 4, HCA: 128}:
            d["compress_ratios"] = self.compress_ratios
        else:
            d["layer_types"] = list(self.layer_types)
            d["compress_rates"] = dict(self.compress_rates)
        hash_n = self.n_hash_layers
        if self.mlp_layer_types == [HASH_MOE] * hash_n + [MOE] * (self.num_hidden_layers - hash_n):
            d["num_hash_layers"] = hash_n
        else:
            d["mlp_layer_types"] = list(self.mlp_layer_types)
        # rope_scaling stays even when None (plain rope on compressed layers): absent, it would read
        # back as the Flash YaRN default.
        if self.quantization_config is not None:
            d["quantization_config"] = dict(self.quantization_config)
        return d

    def replace(self, **kw) -> "ModelConfig":
        return dataclasses.replace(self, **kw)


FP8_QUANTIZATION = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                    "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}


def _tiny() -> ModelConfig:
    # Every layer type and both router kinds, seconds on CPU. Small windows so a few hundred
    # steps cross many CSA/HCA closes and sliding wraps; index_n_heads=32 (FACTS.md: fewer heads
    # make indexer ties that blur oracle tests); index_topk below the compressed count so top-k
    # really selects.
    return ModelConfig(
        vocab_size=512, hidden_size=64, num_hidden_layers=5, num_attention_heads=4, head_dim=32,
        qk_rope_head_dim=16, q_lora_rank=32, o_groups=2, o_lora_rank=32, sliding_window=8,
        layer_types=[SLIDING, CSA, HCA, CSA, HCA], compress_rates={CSA: 4, HCA: 16},
        index_n_heads=32, index_head_dim=32, index_topk=8,
        max_position_embeddings=4096,
        rope_scaling={"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 256,
                      "beta_fast": 32, "beta_slow": 1},
        n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
        mlp_layer_types=[HASH_MOE, HASH_MOE, MOE, MOE, MOE], hc_sinkhorn_iters=20,
    )


def _mini() -> ModelConfig:
    # Flash widths, 6 layers (2 sliding, CSA, HCA, CSA, CSA): fits one H200 with room for HF beside it.
    n = 6
    return ModelConfig(num_hidden_layers=n, layer_types=[SLIDING, SLIDING, CSA, HCA, CSA, CSA],
                       mlp_layer_types=[HASH_MOE] * 3 + [MOE] * (n - 3),
                       quantization_config=dict(FP8_QUANTIZATION))


def _flash() -> ModelConfig:
    return ModelConfig(quantization_config=dict(FP8_QUANTIZATION))


PRESETS = {"tiny": _tiny, "mini": _mini, "flash": _flash}


def preset(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}: allowed {sorted(PRESETS)}")
    return PRESETS[name]()


def yarn_inv_freq(dim: int, base: float, scaling: dict | None) -> "torch.Tensor":  # noqa: F821
    """Inverse frequencies of the interleaved rope, with YaRN when `scaling` says so (as HF computes them)."""
    import torch

    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
    if scaling is None or scaling.get("type", scaling.get("rope_type")) != "yarn":
        return 1.0 / pos_freqs
    factor = float(scaling["factor"])
    orig = scaling["original_max_position_embeddings"]
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def correction_dim(rot):
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
