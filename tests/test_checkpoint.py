import importlib
import json
import math
import os
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from dsv4.checkpoint import CheckpointError, load_weights, random_weights, synth
from dsv4.checkpoint.load import INDEX
from dsv4.config import FP8_QUANTIZATION, ModelConfig, preset
from dsv4.formats import FP4_VALUES, QWeight, quantize_fp4, quantize_fp8, unpack_fp4
from dsv4.layout import local_slice, storage, tensor_specs

F32 = torch.float32
synth_mod = importlib.import_module("dsv4.checkpoint.synth")  # the package attribute `synth` is the function


def dq(x):
    return x.dequant(F32) if isinstance(x, QWeight) else x


def tiny():
    return preset("tiny")


def wide():
    # FP8 slices of rank 1 start inside a 128-block, with several blocks per tensor.
    return tiny().replace(head_dim=96, o_lora_rank=96, q_lora_rank=160, hidden_size=160)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {q: synth(tiny(), root / q, seed=3, quant=q, max_shard_bytes=150_000) for q in ("none", "fp8")}


def same(a, b) -> bool:
    if isinstance(a, QWeight):
        return (isinstance(b, QWeight) and a.fmt == b.fmt and (a.row0, a.col0) == (b.row0, b.col0)
                and torch.equal(a.data.view(torch.uint8) if a.fmt != "dense" else a.data,
                                b.data.view(torch.uint8) if b.fmt != "dense" else b.data)
                and (a.scale is None) == (b.scale is None)
                and (a.scale is None or torch.equal(a.scale.view(torch.uint8), b.scale.view(torch.uint8))))
    return a.dtype == b.dtype and torch.equal(a, b)


# ---------------------------------------------------------------------------
# Quantisation
# ---------------------------------------------------------------------------


def test_fp8_quantize_error_bound_and_scales():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(200, 300, generator=g) * torch.logspace(-3, 2, 300)  # partial edge blocks, wide range
    w[:128, 128:256] = 0
    data, scale = quantize_fp8(w)
    assert data.dtype == torch.float8_e4m3fn and data.shape == (200, 300)
    assert scale.dtype == torch.float8_e8m0fnu and scale.shape == (2, 3)
    s = scale.float()
    assert s[0, 1] == 1  # all-zero block
    assert torch.equal(s, torch.exp2(torch.log2(s).round()))  # powers of two
    amax = torch.nn.functional.pad(w.abs(), (0, 84, 0, 56)).reshape(2, 128, 3, 128).amax((1, 3))
    nz = amax > 0
    assert ((amax[nz] / s[nz] > 224) & (amax[nz] / s[nz] <= 448)).all()
    q = QWeight(data, scale, "fp8").dequant(F32)
    full = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:200, :300]
    assert ((q - w).abs() <= torch.maximum(w.abs() * 2**-4, full * 2**-10)).all()
    # Values on the grid survive exactly.
    d2, s2 = quantize_fp8(q)
    assert torch.equal(QWeight(d2, s2, "fp8").dequant(F32), q)


def test_fp4_quantize_rounding_packing_and_bounds():
    # One group per row, amax 6 -> scale 1: midpoints round to the even code.
    row = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.3, -5.5, 0.0, 1.0] + [0.0] * 20)
    data, scale = quantize_fp4(row[None])
    assert data.dtype == torch.int8 and data.shape == (1, 16) and scale.shape == (1, 1)
    assert scale.float().item() == 1
    expect = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -0.5, -6.0, 0.0, 1.0] + [0.0] * 20
    assert unpack_fp4(data)[0].tolist() == expect
    # Low nibble = even column.
    u8 = data.view(torch.uint8)[0]
    assert (u8[0] & 0xF).item() == FP4_VALUES.index(0.0) and (u8[0] >> 4).item() == FP4_VALUES.index(1.0)

    g = torch.Generator().manual_seed(1)
    w = torch.randn(48, 96, generator=g) * 10.0 ** torch.randint(-3, 3, (48, 3), generator=g).repeat_interleave(32, 1)
    data, scale = quantize_fp4(w)
    assert scale.dtype == torch.float8_e8m0fnu and scale.shape == (48, 3) and data.shape == (48, 48)
    q = QWeight(data, scale, "fp4").dequant(F32)
    full = scale.float().repeat_interleave(32, 1)
    assert ((q - w).abs() <= full).all()  # half the widest gap (4..6) of the grid
    assert ((w.reshape(48, 3, 32).abs().amax(-1) / scale.float()) > 3).all()
    d2, s2 = quantize_fp4(q)
    assert torch.equal(QWeight(d2, s2, "fp4").dequant(F32), q)
    with pytest.raises(ValueError, match="32"):
        quantize_fp4(torch.ones(4, 40))


# ---------------------------------------------------------------------------
# synth -> load
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("quant", ["none", "fp8"])
def test_synth_load_round_trip(ckpts, quant):
    path = ckpts[quant]
    cfg, w = load_weights(path)
    assert cfg.quantized == (quant == "fp8")
    assert cfg.expert_dtype == ("fp4" if quant == "fp8" else "bf16")
    if quant == "fp8":
        assert cfg.quantization_config == FP8_QUANTIZATION
    specs = tensor_specs(cfg)
    assert list(w) == list(specs)
    files = {}
    for f in path.glob("*.safetensors"):
        files.update(load_file(f))
    for name, spec in specs.items():
        kind, v = storage(spec, cfg), w[name]
        on_disk = files[name]
        if kind in ("fp8", "fp4"):
            assert isinstance(v, QWeight) and v.fmt == kind
            assert torch.equal(v.data.view(torch.uint8), on_disk.view(torch.uint8))
            assert torch.equal(v.scale.view(torch.uint8), files[name[:-7] + ".scale"].view(torch.uint8))
        elif kind == "bf16":
            assert on_disk.dtype == torch.bfloat16
            assert torch.equal(dq(v), on_disk.float())
            assert isinstance(v, QWeight) != (name == "embed.weight")
        elif kind == "fp32":
            assert on_disk.dtype == F32 and torch.equal(v, on_disk)
        else:
            assert on_disk.dtype == torch.int32 and v.dtype == torch.int64 and torch.equal(v, on_disk.long())
            assert (v.sort(-1).values.diff(dim=-1) > 0).all()  # distinct experts per token
            assert 0 <= v.min() and v.max() < cfg.n_routed_experts
    # Quantised storage is what the config says: FP8 dense linears, FP4 routed experts.
    if quant == "fp8":
        assert files["layers.1.attn.wq_a.weight"].dtype == torch.float8_e4m3fn
        assert files["layers.1.attn.wq_a.scale"].dtype == torch.float8_e8m0fnu
        assert files["layers.1.ffn.experts.0.w1.weight"].dtype == torch.int8
        assert files["layers.1.ffn.experts.0.w1.scale"].shape == (cfg.moe_intermediate_size, cfg.hidden_size // 32)
    # Every value is random and finite, nothing constant.
    for name in ("layers.2.attn.compressor.ape", "layers.3.ffn.gate.bias", "layers.1.attn.attn_sink",
                 "layers.1.hc_attn_base", "hc_head_fn", "layers.0.attn.wq_b.weight"):
        t = dq(w[name])
        assert t.isfinite().all() and t.std() > 0


@pytest.mark.parametrize("quant", ["none", "fp8"])
def test_loaded_equals_random_weights(ckpts, quant):
    cfg, w = load_weights(ckpts[quant], dtype=torch.bfloat16)
    r = random_weights(cfg, seed=3, dtype=torch.bfloat16)
    assert list(r) == list(w)
    bad = [n for n in w if not same(w[n], r[n])]
    assert not bad


def test_value_statistics(ckpts):
    cfg, w = load_weights(ckpts["fp8"])
    wq_b = dq(w["layers.1.attn.wq_b.weight"])
    assert 0.5 < wq_b.std() * math.sqrt(cfg.q_lora_rank) < 2
    experts = torch.stack([dq(w[f"layers.3.ffn.experts.{e}.w1.weight"]) for e in range(8)])
    assert 0.6 < experts.std() * math.sqrt(cfg.hidden_size) < 1.6
    assert 0.9 < w["embed.weight"].std() < 1.1
    assert (w["layers.1.attn_norm.weight"] - 1).abs().max() < 0.1


def test_shards_and_index(ckpts):
    path = ckpts["fp8"]
    index = json.loads((path / INDEX).read_text())
    shards = sorted(path.glob("*.safetensors"))
    n = len(shards)
    assert n > 2 and [s.name for s in shards] == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    listed, total = {}, 0
    for s in shards:
        with safe_open(s, "pt") as f:
            assert f.metadata() == {"format": "pt"}
            size = 0
            for k in f.keys():
                listed[k] = s.name
                size += f.get_tensor(k).nbytes
            total += size
            assert size <= 150_000
    assert index["weight_map"] == listed
    assert index["metadata"]["total_size"] == total
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (path / name).is_file()
    gen = json.loads((path / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"]) == (0, 1)
    plain = json.loads((ckpts["none"] / "config.json").read_text())
    assert "quantization_config" not in plain and plain["expert_dtype"] == "bf16"


def test_deterministic(tmp_path, ckpts):
    again = synth(tiny(), tmp_path / "again", seed=3, quant="fp8", max_shard_bytes=150_000)
    names = sorted(p.name for p in ckpts["fp8"].iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    for name in names:
        assert (again / name).read_bytes() == (ckpts["fp8"] / name).read_bytes(), name
    other = synth(tiny(), tmp_path / "other", seed=4, quant="fp8", max_shard_bytes=150_000)
    shard = next(n for n in names if n.endswith(".safetensors"))
    assert (other / shard).read_bytes() != (again / shard).read_bytes()


def test_no_overwrite_and_atomic_replace(tmp_path):
    out = tmp_path / "ck"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="ck"):
        synth(tiny(), out)
    assert os.listdir(out) == ["keep.txt"]
    synth(tiny(), out, overwrite=True, quant="fp8")
    assert not (out / "keep.txt").exists() and load_weights(out)[0].quantized
    assert sorted(os.listdir(tmp_path)) == ["ck"]
    empty = tmp_path / "empty"
    empty.mkdir()
    synth(tiny(), empty)  # an empty directory is fine
    assert (empty / "config.json").is_file()


def test_failure_leaves_nothing(tmp_path, monkeypatch):
    calls = []

    def broken(tensors, filename, metadata=None):
        calls.append(filename)
        if len(calls) == 2:
            raise OSError("disk full")
        save_file(tensors, filename, metadata=metadata)

    monkeypatch.setattr(synth_mod, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        synth(tiny(), tmp_path / "ck", max_shard_bytes=150_000)
    assert len(calls) == 2 and os.listdir(tmp_path) == []
    # A failed overwrite keeps the old checkpoint.
    monkeypatch.setattr(synth_mod, "save_file", save_file)
    synth(tiny(), tmp_path / "ck")
    before = sorted(os.listdir(tmp_path / "ck"))
    calls.clear()
    monkeypatch.setattr(synth_mod, "save_file", broken)
    with pytest.raises(OSError):
        synth(tiny(), tmp_path / "ck", max_shard_bytes=150_000, overwrite=True)
    assert os.listdir(tmp_path) == ["ck"] and sorted(os.listdir(tmp_path / "ck")) == before


# ---------------------------------------------------------------------------
# Ranks
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("cfg_fn,quant", [(tiny, "none"), (tiny, "fp8"), (wide, "fp8")])
def test_rank_slices(tmp_path, cfg_fn, quant):
    path = synth(cfg_fn(), tmp_path / "ck", quant=quant)
    cfg, full = load_weights(path)
    seen_mid_block = False
    for rank in range(2):
        _, part = load_weights(path, rank=rank, world=2)
        specs = tensor_specs(cfg, rank, 2)
        assert list(part) == list(specs)
        owned = [int(n.split(".")[4]) for n in part if ".experts." in n]
        assert set(owned) == set(range(4 * rank, 4 * rank + 4))
        for name, spec in specs.items():
            want = dq(full[name])
            sl = local_slice(spec)
            if sl is not None:
                want = want.narrow(*sl)
                q = part[name]
                if isinstance(q, QWeight) and q.fmt == "fp8" and (q.row0 % 128 or q.col0 % 128):
                    seen_mid_block = True
                    assert q.scale.shape[sl[0]] * 128 >= want.shape[sl[0]]
            assert torch.equal(dq(part[name]), want), name
        # A rank's random weights are the same slice of the same random model.
        r = random_weights(cfg, rank=rank, world=2, seed=0)
        assert not [n for n in part if not same(part[n], r[n])]
    assert seen_mid_block == (quant == "fp8")


def test_random_weights_match_loader_layout(ckpts):
    for quant, path in ckpts.items():
        for rank, world in ((0, 1), (1, 2)):
            cfg, w = load_weights(path, rank=rank, world=world, dtype=torch.bfloat16)
            r = random_weights(cfg, rank=rank, world=world, seed=11, dtype=torch.bfloat16)
            assert list(r) == list(w)
            for n in w:
                a, b = w[n], r[n]
                assert type(a) is type(b), n
                if isinstance(a, QWeight):
                    assert (a.fmt, a.shape, a.data.shape, a.data.dtype, a.row0, a.col0) == \
                           (b.fmt, b.shape, b.data.shape, b.data.dtype, b.row0, b.col0), n
                    assert (a.scale is None and b.scale is None) or (
                        a.scale.shape == b.scale.shape and a.scale.dtype == b.scale.dtype), n
                else:
                    assert (a.shape, a.dtype) == (b.shape, b.dtype), n


# ---------------------------------------------------------------------------
# Bad checkpoints
# ---------------------------------------------------------------------------


def _rewrite(path, name, fn):
    """Apply fn(dict) to the shard holding `name` (or layers.0.attn.wkv.weight); return its file name."""
    index = json.loads((path / INDEX).read_text())
    fname = index["weight_map"].get(name) or index["weight_map"]["layers.0.attn.wkv.weight"]
    tensors = load_file(path / fname)
    fn(tensors)
    save_file(tensors, path / fname, metadata={"format": "pt"})
    return fname


def _drop_from_index(path, name):
    index = json.loads((path / INDEX).read_text())
    del index["weight_map"][name]
    (path / INDEX).write_text(json.dumps(index))


def _point_to_missing_shard(path, name):
    index = json.loads((path / INDEX).read_text())
    index["weight_map"][name] = "model-00099-of-00099.safetensors"
    (path / INDEX).write_text(json.dumps(index))
    return "model-00099-of-00099.safetensors"


def _case(quant, name, fn):
    return quant, name, lambda p: _rewrite(p, name, fn)


WQA, WQA_S = "layers.1.attn.wq_a.weight", "layers.1.attn.wq_a.scale"
TID = "layers.0.ffn.gate.tid2eid"
BAD = {
    "missing": _case("none", "layers.1.attn.wkv.weight", lambda t: t.pop("layers.1.attn.wkv.weight")),
    "missing_everywhere": ("none", "layers.1.attn.wkv.weight",
                           lambda p: (_rewrite(p, "layers.1.attn.wkv.weight",
                                               lambda t: t.pop("layers.1.attn.wkv.weight")),
                                      _drop_from_index(p, "layers.1.attn.wkv.weight"), INDEX)[-1]),
    "extra": _case("none", "layers.0.attn.bogus", lambda t: t.update({"layers.0.attn.bogus": torch.zeros(2)})),
    "extra_scale_in_plain": _case("none", WQA_S, lambda t: t.update({WQA_S: torch.ones(1, 1)})),
    "misshaped": _case("none", "layers.2.attn.compressor.ape",
                       lambda t: t.update({"layers.2.attn.compressor.ape": torch.zeros(3, 32)})),
    "fp8_as_bf16": _case("fp8", WQA, lambda t: t.update({WQA: t[WQA].to(torch.bfloat16)})),
    "missing_scale": _case("fp8", WQA_S, lambda t: t.pop(WQA_S)),
    "scale_dtype": _case("fp8", WQA_S, lambda t: t.update({WQA_S: t[WQA_S].to(torch.bfloat16)})),
    "scale_shape": _case("fp8", WQA_S, lambda t: t.update({WQA_S: torch.ones(2, 1).to(torch.float8_e8m0fnu)})),
    "fp4_shape": _case("fp8", "layers.2.ffn.experts.5.w2.weight",
                       lambda t: t.update({"layers.2.ffn.experts.5.w2.weight": torch.zeros(64, 64, dtype=torch.int8)})),
    "float_tid2eid": _case("fp8", TID, lambda t: t.update({TID: t[TID].float()})),
    "tid2eid_range": _case("none", TID, lambda t: t[TID].__setitem__((7, 1), 8)),
    "shard_missing": ("none", "layers.3.ffn.gate.bias", lambda p: _point_to_missing_shard(p, "layers.3.ffn.gate.bias")),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_checkpoint(ckpts, tmp_path, case):
    quant, name, corrupt = BAD[case]
    path = tmp_path / "ck"
    shutil.copytree(ckpts[quant], path)
    fname = corrupt(path)
    with pytest.raises(CheckpointError) as e:
        load_weights(path)
    assert repr(name) in str(e.value) and fname in str(e.value), str(e.value)


def test_bad_arguments(ckpts, tmp_path):
    with pytest.raises(ValueError, match="quant"):
        synth(tiny(), tmp_path / "x", quant="int4")
    with pytest.raises(ValueError, match="rank"):
        load_weights(ckpts["none"], rank=2, world=2)
    with pytest.raises(ValueError, match="divisible"):
        random_weights(tiny(), rank=0, world=3)
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_weights(tmp_path, tiny())


def test_missing_config(ckpts, tmp_path):
    path = tmp_path / "ck"
    shutil.copytree(ckpts["none"], path)
    (path / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json"):
        load_weights(path)
    load_weights(path, tiny().replace(quantization_config=None, expert_dtype="bf16"))  # an explicit cfg works


def test_single_file_and_mtp_ignored(ckpts, tmp_path):
    path = tmp_path / "ck"
    path.mkdir()
    shutil.copy(ckpts["fp8"] / "config.json", path)
    tensors = {}
    for f in ckpts["fp8"].glob("*.safetensors"):
        tensors.update(load_file(f))
    tensors["mtp.0.emb.weight"] = torch.zeros(2, 2)
    save_file(tensors, path / "model.safetensors")
    _, w = load_weights(path)
    _, ref = load_weights(ckpts["fp8"])
    assert list(w) == list(ref) and all(same(w[n], ref[n]) for n in w)


# ---------------------------------------------------------------------------
# HF transformers reads the same checkpoint
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("quant", ["none", "fp8"])
def test_hf_loads_synth(ckpts, quant):
    transformers = pytest.importorskip("transformers")
    path = ckpts[quant]
    cfg, w = load_weights(path)
    model, info = transformers.DeepseekV4ForCausalLM.from_pretrained(path, dtype=F32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    sd = {k: v.float() for k, v in model.state_dict().items()}
    assert torch.equal(sd["model.layers.1.self_attn.q_a_proj.weight"], dq(w["layers.1.attn.wq_a.weight"]))
    assert torch.equal(sd["model.layers.3.self_attn.o_b_proj.weight"], dq(w["layers.3.attn.wo_b.weight"]))
    assert torch.equal(sd["lm_head.weight"], dq(w["head.weight"]))
    assert torch.equal(sd["model.layers.1.self_attn.sinks"], w["layers.1.attn.attn_sink"])
    assert torch.equal(sd["model.layers.0.mlp.gate.tid2eid"].long(), w[TID])
    assert torch.equal(sd["model.layers.3.mlp.shared_experts.down_proj.weight"],
                       dq(w["layers.3.ffn.shared_experts.w2.weight"]))
    for e in range(cfg.n_routed_experts):
        p = f"layers.1.ffn.experts.{e}."
        gate_up = torch.cat([dq(w[p + "w1.weight"]), dq(w[p + "w3.weight"])])
        assert torch.equal(sd["model.layers.1.mlp.experts.gate_up_proj"][e], gate_up)
        assert torch.equal(sd["model.layers.1.mlp.experts.down_proj"][e], dq(w[p + "w2.weight"]))
    # The random model is numerically alive in HF's forward.
    with torch.no_grad():
        out = model.float()(torch.arange(40)[None] * 7 % cfg.vocab_size, output_hidden_states=True)
    assert out.logits.isfinite().all() and 0.3 < out.logits.std() < 3
    stds = [h.std().item() for h in out.hidden_states]
    assert all(0.5 < s < 3 for s in stds), stds


def _first_shard(path):
    return sorted(path.glob("model-*.safetensors"))[0]


def _truncate(path):
    shard = _first_shard(path)
    data = shard.read_bytes()
    shard.write_bytes(data[:len(data) - 100])
    return shard, "truncated: its header promises"


def _random_bytes(path):
    shard = _first_shard(path)
    shard.write_bytes(torch.randint(0, 256, (shard.stat().st_size,), generator=torch.Generator().manual_seed(0),
                                    dtype=torch.uint8).numpy().tobytes())
    return shard, "not a safetensors file"


def _header_only(path):
    shard = _first_shard(path)
    shard.write_bytes(shard.read_bytes()[:5])
    return shard, "too short for a safetensors header"


def _not_json(path):
    shard = _first_shard(path)
    shard.write_bytes((20).to_bytes(8, "little") + b"{not json at all....")
    return shard, "header is not JSON"


@pytest.mark.parametrize("damage", [_truncate, _random_bytes, _header_only, _not_json])
def test_damaged_shard_is_named(ckpts, tmp_path, damage):
    """A shard cut short or overwritten: a CheckpointError naming the file and what is wrong (never a
    MemoryError from a length read out of random bytes), before any tensor is read."""
    path = tmp_path / "ck"
    shutil.copytree(ckpts["fp8"], path)
    shard, what = damage(path)
    with pytest.raises(CheckpointError) as e:
        load_weights(path)
    assert str(e.value).startswith(f"{shard}: ") and what in str(e.value), str(e.value)


# ---------------------------------------------------------------------------
# Memory: estimated up front, refused before reading
# ---------------------------------------------------------------------------


def _held_bytes(weights) -> int:
    total = 0
    for w in weights.values():
        for t in ((w.data, w.scale) if isinstance(w, QWeight) else (w,)):
            total += 0 if t is None else t.numel() * t.element_size()
    return total


@pytest.mark.parametrize("quant", ["none", "fp8"])
def test_weight_bytes_is_what_a_rank_holds(ckpts, quant):
    from dsv4.checkpoint.memory import weight_bytes

    for rank, world in ((0, 1), (1, 2)):
        for dtype in (torch.float32, torch.bfloat16):
            cfg, w = load_weights(ckpts[quant], rank=rank, world=world, dtype=dtype)
            assert weight_bytes(cfg, rank, world, dtype) == _held_bytes(w)


def test_not_enough_memory_is_refused_before_reading(ckpts, monkeypatch):
    from dsv4.checkpoint import NotEnoughMemoryError, memory
    from dsv4.checkpoint.memory import weight_bytes

    load_mod = importlib.import_module("dsv4.checkpoint.load")
    monkeypatch.setattr(memory, "available_bytes", lambda device: (2**20, "available RAM"))
    monkeypatch.setattr(load_mod, "_read", lambda *a: pytest.fail("read a tensor before refusing"))
    with pytest.raises(NotEnoughMemoryError) as e:
        load_weights(ckpts["fp8"], rank=0, world=2)
    need = 2 * weight_bytes(ModelConfig.from_json(ckpts["fp8"] / "config.json"), 0, 2, torch.float32)
    assert str(e.value) == (f"{ckpts['fp8']}: the weights of 2 CPU ranks need {need / 2**20:.1f} MiB "
                            f"(float32 on cpu), 1.0 MiB available RAM")
    import dsv4

    with pytest.raises(NotEnoughMemoryError, match="preset 'tiny': its weights need .* MiB available RAM"):
        dsv4.load("tiny", device="cpu")


def test_memory_figures_are_real():
    from dsv4.checkpoint.memory import available_bytes

    free, what = available_bytes(torch.device("cpu"))
    assert 0 < free and what


# ---------------------------------------------------------------------------
# The tokenizer: the checkpoint's own, or a stand-in only when asked
# ---------------------------------------------------------------------------


def test_missing_tokenizer_is_an_error_unless_the_stand_in_is_asked_for(ckpts, tmp_path, capfd):
    import dsv4

    path = tmp_path / "ck"
    shutil.copytree(ckpts["none"], path)
    (path / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match=f"{path / 'tokenizer.json'}: no such file"):
        dsv4.load(path, device="cpu")
    model = dsv4.load(path, device="cpu", tokenizer="stand-in")
    assert "stand-in tokenizer" in capfd.readouterr().err
    assert model.tokenizer.decode(model.tokenizer.encode("hello", add_bos=False)) == "hello"
    with pytest.raises(ValueError, match="tokenizer='bpe'"):
        dsv4.load(path, device="cpu", tokenizer="bpe")


@pytest.mark.parametrize("text", ["\x89 not json", '{"weight_map": [1]}', "[]", '{"weight_map": {"a": 3}}'])
def test_damaged_index_is_named(ckpts, tmp_path, text):
    path = tmp_path / "ck"
    shutil.copytree(ckpts["none"], path)
    (path / INDEX).write_text(text)
    with pytest.raises(CheckpointError, match=f"^{path / INDEX}: not a valid index"):
        load_weights(path)
