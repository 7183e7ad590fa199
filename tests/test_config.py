"""ModelConfig: official/HF config.json (legacy keys too), presets, errors naming the field."""

import json

import pytest

from dsv4.config import CSA, HASH_MOE, HCA, MOE, SLIDING, ConfigError, ModelConfig, preset

FLASH_OFFICIAL = {  # the keys the official DeepSeek-V4-Flash config.json ships
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "vocab_size": 129280,
    "hidden_size": 4096, "num_hidden_layers": 43, "num_attention_heads": 64, "num_key_value_heads": 1,
    "head_dim": 512, "qk_rope_head_dim": 64, "q_lora_rank": 1024, "o_groups": 8, "o_lora_rank": 1024,
    "sliding_window": 128, "compress_ratios": [0, 0] + [4, 128] * 20 + [4], "num_hash_layers": 3,
    "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512, "n_routed_experts": 256,
    "num_experts_per_tok": 6, "n_shared_experts": 1, "moe_intermediate_size": 2048,
    "scoring_func": "sqrtsoftplus", "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "hc_mult": 4,
    "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rope_theta": 10000, "compress_rope_theta": 160000,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
    "expert_dtype": "fp4", "eos_token_id": 1, "bos_token_id": 0,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
}


def test_official_legacy_keys_give_flash():
    cfg = ModelConfig.from_dict(FLASH_OFFICIAL)
    assert cfg.compress_ratios == FLASH_OFFICIAL["compress_ratios"]
    assert cfg.layer_types[:3] == [SLIDING, SLIDING, CSA] and cfg.layer_types[3] == HCA
    assert cfg.mlp_layer_types == [HASH_MOE] * 3 + [MOE] * 40
    assert cfg.quantized and cfg.expert_dtype == "fp4"
    assert cfg.rope_scaling["factor"] == 16
    assert cfg == preset("flash")


def test_round_trip_and_hf_agrees(tmp_path):
    transformers = pytest.importorskip("transformers")
    for name in ("tiny", "mini", "flash"):
        cfg = preset(name)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(cfg.to_dict()))
        assert ModelConfig.from_json(path) == cfg
        hf = transformers.DeepseekV4Config(**{k: v for k, v in cfg.to_dict().items() if k != "quantization_config"})
        assert hf.layer_types == cfg.layer_types
        assert hf.mlp_layer_types == cfg.mlp_layer_types
        assert hf.compress_rates == cfg.compress_rates
        assert hf.qk_rope_head_dim == cfg.qk_rope_head_dim


def test_custom_rates_use_modern_keys():
    cfg = preset("tiny")
    d = cfg.to_dict()
    assert "layer_types" in d and d["compress_rates"] == {CSA: 4, HCA: 16}
    assert ModelConfig.from_dict(d) == cfg


@pytest.mark.parametrize("field,value,needle", [
    ("num_key_value_heads", 2, "allowed 1"),
    ("scoring_func", "relu", "sqrtsoftplus"),
    ("o_groups", 3, "divide num_attention_heads"),
    ("layer_types", ["full_attention"] * 5, "entries allowed"),
    ("mlp_layer_types", ["dense"] * 5, "entries allowed"),
    ("hidden_size", 0, "positive integer"),
    ("qk_rope_head_dim", 7, "even integer"),
    ("expert_dtype", "int4", "allowed"),
    ("num_experts_per_tok", 99, "at most n_routed_experts"),
])
def test_bad_field_is_named(field, value, needle):
    d = preset("tiny").to_dict()
    d[field] = value
    with pytest.raises(ConfigError, match=field) as e:
        ModelConfig.from_dict(d)
    assert needle in str(e.value)


def test_bad_files_and_values(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        ModelConfig.from_json(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelConfig.from_json(bad)
    bad.write_bytes(b"\x89\xff\x00 random")
    with pytest.raises(ConfigError, match=f"^{bad}: not valid JSON"):
        ModelConfig.from_json(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError, match=f"^{bad}: not a JSON object"):
        ModelConfig.from_json(bad)
    with pytest.raises(ConfigError, match="compress_ratios"):
        ModelConfig.from_dict({**FLASH_OFFICIAL, "compress_ratios": [0, 0] + [8] * 41})
    with pytest.raises(ConfigError, match="model_type"):
        ModelConfig.from_dict({**FLASH_OFFICIAL, "model_type": "llama"})
    with pytest.raises(ConfigError, match="quantization_config"):
        ModelConfig.from_dict({**FLASH_OFFICIAL, "quantization_config": {"quant_method": "awq"}})
    with pytest.raises(ConfigError, match="unknown preset"):
        preset("huge")


def test_plain_rope_round_trips():
    cfg = preset("tiny").replace(rope_scaling=None)
    back = ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back.rope_scaling is None and back == cfg


def _group_of(key):
    from dsv4.config import REQUIRED_KEYS

    return next(g for g in REQUIRED_KEYS if key in g)


@pytest.mark.parametrize("key", [k for k in FLASH_OFFICIAL if k not in (
    "architectures", "model_type", "quantization_config", "num_hash_layers", "num_key_value_heads",
    "bos_token_id", "eos_token_id")])
def test_a_key_left_out_of_config_json_is_named(tmp_path, key):
    """Every key the official config ships that sets the model (no silent Flash value): an error naming
    the key (and its other spelling) and the file."""
    d = {k: v for k, v in FLASH_OFFICIAL.items() if k != key}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ConfigError, match=f"^{path}: config key .*'{key}'.* missing") as e:
        ModelConfig.from_json(path)
    if key != "expert_dtype":
        assert all(repr(k) in str(e.value) for k in _group_of(key))
    if key == "compress_ratios":  # the other spelling satisfies it
        path.write_text(json.dumps({**d, "layer_types": preset("flash").layer_types}))
        assert ModelConfig.from_json(path) == preset("flash")


def test_official_and_written_configs_load(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(FLASH_OFFICIAL))
    assert ModelConfig.from_json(path) == preset("flash")
    plain = {k: v for k, v in FLASH_OFFICIAL.items() if k not in ("quantization_config", "expert_dtype")}
    path.write_text(json.dumps(plain))  # a plain checkpoint needs no expert_dtype
    assert not ModelConfig.from_json(path).quantized


def test_keys_that_may_be_left_out_keep_hf_defaults():
    """A key a config.json may omit takes the default HF's DeepseekV4Config takes too."""
    transformers = pytest.importorskip("transformers")
    from dsv4.config import HF_DEFAULT_KEYS

    ours, hf = ModelConfig(), transformers.DeepseekV4Config()
    for key in HF_DEFAULT_KEYS:
        assert getattr(ours, key) == getattr(hf, key), key
    assert ours.mlp_layer_types == hf.mlp_layer_types and ours.compress_rates == hf.compress_rates
    # and the grouped keys that must be given do differ from HF's defaults
    assert ours.layer_types != hf.layer_types and ModelConfig(head_dim=256).qk_rope_head_dim != 256 // 8
