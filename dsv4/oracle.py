"""The oracle: HF transformers' DeepseekV4ForCausalLM holding the very weights of a dsv4 model.

Used where a checkpoint on disk is impractical (random `mini` weights on a GPU): the HF model is
built on the target device and each of its parameters is filled from the dsv4 weights,
dequantised. On-disk checkpoints should instead be loaded by HF's own loader (see
tests/test_oracle.py), which also proves the format.
"""

from __future__ import annotations

import re

import torch

from .config import ModelConfig


def hf_config(cfg: ModelConfig):
    from transformers import DeepseekV4Config

    d = {k: v for k, v in cfg.to_dict().items() if k not in ("quantization_config", "architectures", "torch_dtype")}
    return DeepseekV4Config(**d)


def official_name(hf_name: str) -> str:
    """HF parameter name -> official checkpoint name (experts excepted: HF fuses them)."""
    s = hf_name
    fixed = {"model.embed_tokens.weight": "embed.weight", "lm_head.weight": "head.weight",
             "model.norm.weight": "norm.weight"}
    if s in fixed:
        return fixed[s]
    m = re.fullmatch(r"model\.hc_head\.hc_(fn|base|scale)", s)
    if m:
        return f"hc_head_{m[1]}"
    s = s.removeprefix("model.")
    for a, b in ((".self_attn.compressor.indexer.scorer.weights_proj.", ".attn.indexer.weights_proj."),
                 (".self_attn.compressor.indexer.q_b_proj.", ".attn.indexer.wq_b."),
                 (".self_attn.compressor.indexer.", ".attn.indexer.compressor."),
                 (".self_attn.", ".attn."), (".mlp.", ".ffn."),
                 (".input_layernorm.", ".attn_norm."), (".post_attention_layernorm.", ".ffn_norm."),
                 (".q_a_proj.", ".wq_a."), (".q_b_proj.", ".wq_b."), (".kv_proj.", ".wkv."),
                 (".gate_proj.", ".wgate."), (".o_a_proj.", ".wo_a."), (".o_b_proj.", ".wo_b."),
                 (".q_a_norm.", ".q_norm."), (".gate.e_score_correction_bias", ".gate.bias")):
        s = s.replace(a, b)
    s = re.sub(r"\.attn_hc\.(fn|base|scale)$", r".hc_attn_\1", s)
    s = re.sub(r"\.ffn_hc\.(fn|base|scale)$", r".hc_ffn_\1", s)
    s = re.sub(r"\.sinks$", ".attn_sink", s)
    s = re.sub(r"\.position_bias$", ".ape", s)
    s = re.sub(r"compressor\.kv_norm\.", "compressor.norm.", s)
    s = s.replace(".shared_experts.wgate.", ".shared_experts.w1.").replace(".shared_experts.up_proj.",
                                                                            ".shared_experts.w3.")
    return s.replace(".shared_experts.down_proj.", ".shared_experts.w2.")


def _dense(w, dtype):
    return w.dequant(dtype) if hasattr(w, "dequant") else w.to(dtype)


def _upcasting_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """HF's eager DeepseekV4Experts.forward, reading weights stored in a narrower dtype.

    Used when the routed experts are held in bf16 (exact for FP4 x power-of-two values) so an fp32
    HF `mini` fits one GPU; each selected expert's weights are upcast where they are read.
    """
    import torch.nn.functional as F

    final = torch.zeros_like(hidden_states)
    mask = F.one_hot(top_k_index, num_classes=self.num_experts).permute(2, 1, 0)
    hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    for expert_idx in hit:
        expert_idx = expert_idx[0]
        top_k_pos, token_idx = torch.where(mask[expert_idx])
        gate_up = self.gate_up_proj[expert_idx].to(hidden_states.dtype)
        current = self._apply_gate(F.linear(hidden_states[token_idx], gate_up))
        current = F.linear(current, self.down_proj[expert_idx].to(hidden_states.dtype))
        final.index_add_(0, token_idx, (current * top_k_weights[token_idx, top_k_pos, None]).to(final.dtype))
    return final


@torch.no_grad()
def hf_model_from(model, dtype=torch.bfloat16, expert_dtype=None):
    """An HF DeepseekV4ForCausalLM on the model's device with the model's weights (one rank only).

    `expert_dtype` (e.g. bf16 under an fp32 `dtype`) stores the routed experts narrower; HF's
    eager expert loop then upcasts each expert it runs (see _upcasting_experts_forward).
    """
    from transformers import DeepseekV4ForCausalLM
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as hf_mod

    if model.world != 1:
        raise ValueError("hf_model_from needs a single-rank model")
    cfg, tr = model.cfg, model.transformer
    hcfg = hf_config(cfg)
    prev_dev, prev_dtype = torch.get_default_device(), torch.get_default_dtype()
    torch.set_default_device(model.device)
    torch.set_default_dtype(expert_dtype or dtype)
    try:
        hf = DeepseekV4ForCausalLM(hcfg).eval()
    finally:
        torch.set_default_device(prev_dev)
        torch.set_default_dtype(prev_dtype)
    if expert_dtype is not None and expert_dtype != dtype:
        for mod in hf.modules():
            if isinstance(mod, hf_mod.DeepseekV4Experts):
                mod.forward = _upcasting_experts_forward.__get__(mod)
                continue
            for name, p in mod.named_parameters(recurse=False):
                setattr(mod, name, torch.nn.Parameter(p.data.to(dtype), requires_grad=False))
            for name, b in mod.named_buffers(recurse=False):
                if b.is_floating_point():
                    setattr(mod, name, b.to(dtype))
    _fill(hf, model)
    return hf


def _fill(hf, model):
    """Every parameter and buffer of the HF model from the dsv4 model's weights, dequantised (rotary tables
    excepted: HF computes its own). An HF layer past the model's layers is its MTP layer (`mtp.0.`)."""
    cfg, tr = model.cfg, model.transformer
    flat, n, I = tr.flat_weights(), cfg.num_hidden_layers, cfg.moe_intermediate_size
    for name, p in list(hf.named_parameters()) + list(hf.named_buffers()):
        if "rotary_emb" in name:
            continue
        m = re.fullmatch(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)", name)
        if m:
            stack = (tr.layers[int(m[1])] if int(m[1]) < n else tr.mtp[int(m[1]) - n])["ffn"]["experts"]
            for e in range(cfg.n_routed_experts):
                if m[2] == "gate_up_proj":
                    p[e, :I].copy_(_dense(_take(stack["w1"], e), p.dtype))
                    p[e, I:].copy_(_dense(_take(stack["w3"], e), p.dtype))
                else:
                    p[e].copy_(_dense(_take(stack["w2"], e), p.dtype))
            continue
        official = official_name(name)
        if official.startswith(f"layers.{n}."):
            official = "mtp.0." + official.removeprefix(f"layers.{n}.")
        src = flat.get(official)
        if src is None:
            raise KeyError(f"no dsv4 weight for HF {name} ({official})")
        p.copy_(_dense(src, p.dtype) if p.is_floating_point() else src.to(p.dtype))


def _take(stack, e):
    from .model.moe import take

    return take(stack, e)


@torch.no_grad()
def hf_mtp_logits(model, ids, dtype=torch.float32) -> torch.Tensor:
    """The MTP layer's logits by the reference's formula (DeepSeek's MTPBlock) over HF's own layers: HF's
    DeepseekV4Model of num_hidden_layers + 1 layers, the last one holding mtp.0's decoder layer (a sliding, score-
    routed layer), the main layers giving the streams h[t] before the head; then for each position t < S - 1:
    x = e_proj(enorm(embed(ids[t + 1]))) + h_proj(hnorm(h[t])) (every stream), HF's decoder layer over those rows
    (causal, the sliding window), the layer's own hc_head (HF's HyperHead's math) and norm, and the model's head.
    -> [S - 1, vocab] fp32. One rank; a model loaded with mtp=True."""
    import torch.nn.functional as F
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
    from transformers.masking_utils import create_sliding_window_causal_mask

    from .config import MOE, SLIDING

    if model.world != 1 or not model.transformer.mtp:
        raise ValueError("hf_mtp_logits needs a single-rank model with its MTP layer (mtp=True)")
    cfg, tr = model.cfg, model.transformer
    n = cfg.num_hidden_layers
    d = {k: v for k, v in cfg.to_dict().items() if k not in ("quantization_config", "architectures", "torch_dtype",
                                                              "compress_ratios", "num_hash_layers")}
    d.update(num_hidden_layers=n + 1, layer_types=[*cfg.layer_types, SLIDING],
             mlp_layer_types=[*cfg.mlp_layer_types, MOE], compress_rates=dict(cfg.compress_rates))
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        hf = DeepseekV4ForCausalLM(DeepseekV4Config(**d)).eval()
    finally:
        torch.set_default_dtype(prev)
    _fill(hf, model)
    L = tr.mtp[0]
    ids = torch.tensor([list(ids)])
    S, eps = ids.shape[1], cfg.rms_norm_eps
    body = hf.model

    def run(layers, h, input_ids):
        pos = torch.arange(h.shape[1]).unsqueeze(0)
        embeds = h[:, :, 0]
        mask = create_sliding_window_causal_mask(config=body.config, inputs_embeds=embeds, attention_mask=None,
                                                 past_key_values=None, position_ids=pos)
        rope = {kind: body.rotary_emb(embeds, position_ids=pos, layer_type=kind) for kind in ("main", "compress")}
        for layer in layers:
            h = layer(h, position_embeddings=rope, position_ids=pos, attention_mask=mask, input_ids=input_ids)
        return h

    def norm(x, w):
        return _dense(w, dtype) * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(dtype)

    h = run(body.layers[:n], body.embed_tokens(ids).unsqueeze(2).expand(-1, -1, cfg.hc_mult, -1).contiguous(), ids)
    e = norm(body.embed_tokens(ids[:, 1:]), L["enorm"])
    x = F.linear(e, _dense(L["e_proj"], dtype)).unsqueeze(2) + F.linear(norm(h[:, :S - 1], L["hnorm"]),
                                                                          _dense(L["h_proj"], dtype))
    x = run(body.layers[n:], x, ids[:, 1:])
    fn, base, scale = (_dense(t, torch.float32) for t in L["hc_head"])
    flat_x = x.flatten(2).float()
    mixes = F.linear(flat_x * torch.rsqrt(flat_x.square().mean(-1, keepdim=True) + eps), fn)
    pre = torch.sigmoid(mixes * scale + base) + cfg.hc_eps
    y = (pre.unsqueeze(-1) * x.float()).sum(dim=2).to(dtype)
    return hf.lm_head(norm(y, L["norm"]))[0].float()
