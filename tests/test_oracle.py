"""dsv4 against the oracle: HF transformers 5.17.0 DeepseekV4ForCausalLM on the very same checkpoint.

HF loads the `dsv4 synth` directory through its own loader (conversion mapping, FP8/FP4
dequantisation); dsv4 loads it through dsv4.load. Both run fp32. Tolerance, per step:
max |logits_dsv4 - logits_hf| / max |logits_hf| <= 1e-4 (measured ~5e-6: summation order only).
Greedy streams must be identical.
"""

from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4.checkpoint.synth import synth
from dsv4.config import preset

transformers = pytest.importorskip("transformers")

TOL = 1e-4
STEPS = 300


def hf_model(path):
    from transformers import DeepseekV4ForCausalLM

    model = DeepseekV4ForCausalLM.from_pretrained(path, dtype=torch.float32)
    # On CPU HF dequantises an FP8/FP4 checkpoint to bf16 and leaves bf16-stored tensors bf16:
    # both are exact in fp32 (e4m3 and e2m1 times a power of two fit bf16), so upcasting loses nothing.
    return model.float().eval()


def hf_stream(model, prompt, feed):
    """HF prefill of `prompt` then one-token decode of each id in `feed`; logits after each."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out = [model(torch.tensor([prompt]), past_key_values=cache, use_cache=True).logits[0, -1]]
    for t in feed:
        out.append(model(torch.tensor([[t]]), past_key_values=cache, use_cache=True).logits[0, -1])
    return out


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.fixture(scope="module", params=["none", "fp8"])
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"tiny-{request.param}") / "ckpt"
    synth(preset("tiny"), path, seed=7, quant=request.param)
    return path


# A prompt that ends on a CSA+HCA window boundary (16) and one that does not (13), each checkpoint once in CI; the
# other two pairs in the slow set (CI's 15 minutes, session 38).
@pytest.mark.parametrize("checkpoint,prompt_len", [("none", 16), ("fp8", 13),
                                                   pytest.param("none", 13, marks=pytest.mark.slow),
                                                   pytest.param("fp8", 16, marks=pytest.mark.slow)],
                         indirect=["checkpoint"])
@torch.inference_mode()
def test_matches_hf_prefill_and_300_decode_steps(checkpoint, prompt_len):
    ours = dsv4.load(checkpoint, device="cpu", dtype=torch.float32)
    theirs = hf_model(checkpoint)
    g = torch.Generator().manual_seed(prompt_len)
    ids = torch.randint(2, ours.cfg.vocab_size, (prompt_len + STEPS,), generator=g).tolist()
    prompt, feed = ids[:prompt_len], ids[prompt_len:]
    ref = hf_stream(theirs, prompt, feed)
    state = ours.new_state(len(ids) + 1)
    mine = [ours.prefill(state, prompt, chunk_size=5)] + [ours.decode(state, t) for t in feed]
    # crosses: sliding window 8 (many wraps), CSA rate 4 and HCA rate 16 closes, indexer top-8 of up to 79
    assert state.host_pos == len(ids) > 16 * 16
    errors = [rel(a, b) for a, b in zip(mine, ref)]
    worst = max(range(len(errors)), key=errors.__getitem__)
    assert errors[worst] <= TOL, f"position {prompt_len - 1 + worst}: rel err {errors[worst]:.3g}"


@torch.inference_mode()
def test_greedy_stream_identical_to_hf(checkpoint):
    ours = dsv4.load(checkpoint, device="cpu", dtype=torch.float32)
    theirs = hf_model(checkpoint)
    prompt = ours.tokenizer.encode("The quick brown fox jumps over the lazy dog.")
    n = 64
    hf_ids = theirs.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             eos_token_id=None)[0, len(prompt):].tolist()
    state = ours.new_state(len(prompt) + n + 1)
    ours.prefill(state, prompt[:-1])
    token, mine = prompt[-1], []
    for _ in range(n):
        token = ours.step(state, token, dsv4.SamplingParams.greedy())
        mine.append(token)
    assert mine == hf_ids


CUSTOM = [
    # other rates and widths: CSA rate 2, HCA rate 8, window 5, two streams, sigmoid router, 3 experts/token
    dict(vocab_size=300, hidden_size=48, num_hidden_layers=4, num_attention_heads=6, head_dim=16,
         qk_rope_head_dim=8, q_lora_rank=24, o_groups=3, o_lora_rank=20, sliding_window=5,
         layer_types=["compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention",
                      "compressed_sparse_attention"],
         compress_rates={"compressed_sparse_attention": 2, "heavily_compressed_attention": 8},
         index_n_heads=32, index_head_dim=16, index_topk=3, hc_mult=2, hc_sinkhorn_iters=7,
         n_routed_experts=6, num_experts_per_tok=3, moe_intermediate_size=32, scoring_func="sigmoid",
         mlp_layer_types=["moe", "hash_moe", "moe", "moe"], routed_scaling_factor=2.5, swiglu_limit=3.0,
         rope_scaling=None),
    # the official legacy keys with default rates, one expert per token, YaRN factor 4
    dict(vocab_size=320, hidden_size=64, num_hidden_layers=3, num_attention_heads=2, head_dim=32,
         qk_rope_head_dim=32, q_lora_rank=16, o_groups=1, o_lora_rank=16, sliding_window=16,
         compress_ratios=[4, 128, 4], num_hash_layers=1, index_n_heads=32, index_head_dim=32, index_topk=4,
         n_routed_experts=4, num_experts_per_tok=1, moe_intermediate_size=32, scoring_func="sqrtsoftplus",
         rope_scaling={"type": "yarn", "factor": 4, "original_max_position_embeddings": 64}),
]


@pytest.mark.parametrize("index", range(len(CUSTOM)))
@torch.inference_mode()
def test_custom_configs_match_hf(index, tmp_path):
    from dsv4.config import ModelConfig

    cfg = ModelConfig.from_dict(CUSTOM[index])
    synth(cfg, tmp_path / "ckpt", seed=index, quant="none")
    ours = dsv4.load(tmp_path / "ckpt", device="cpu", dtype=torch.float32)
    theirs = hf_model(tmp_path / "ckpt")
    ids = torch.randint(2, cfg.vocab_size, (150,), generator=torch.Generator().manual_seed(index)).tolist()
    ref = hf_stream(theirs, ids[:7], ids[7:])
    state = ours.new_state(len(ids))
    mine = [ours.prefill(state, ids[:7], chunk_size=3)] + [ours.decode(state, t) for t in ids[7:]]
    errors = [rel(a, b) for a, b in zip(mine, ref)]
    assert max(errors) <= TOL, f"worst at position {6 + errors.index(max(errors))}: {max(errors):.3g}"


def test_hf_model_from_holds_the_models_weights(tmp_path):
    """dsv4.oracle.hf_model_from (the GPU benchmarks' oracle: HF's model filled from a dsv4 model in memory) gives
    the logits HF's own loader gives from the checkpoint on disk."""
    from dsv4.oracle import hf_model_from

    path = synth(preset("tiny"), tmp_path / "ckpt", seed=7, quant="fp8")
    ids = torch.tensor([[3, 9, 27, 81, 5, 6, 7]])
    filled = hf_model_from(dsv4.load(path, device="cpu", dtype=torch.float32), dtype=torch.float32)
    assert rel(filled(ids).logits[0], hf_model(path)(ids).logits[0]) <= TOL
