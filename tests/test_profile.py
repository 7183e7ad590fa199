"""dsv4 bench --profile's pieces: phases of a step and bytes read per token (CPU: host time per phase)."""

from __future__ import annotations

import torch

import dsv4
from dsv4.profile import PHASES


def test_profile_steps_phases_and_bytes():
    model = dsv4.load("tiny", device="cpu", dtype=torch.float32, seed=2)
    cfg = model.cfg
    state = model.new_state(64)
    model.prefill(state, list(range(1, 30)))
    rec = model.profile_steps(state, 5, dsv4.SamplingParams(temperature=1.0, seed=3), steps=3)
    phases = rec["phases_us_per_token"]
    assert set(PHASES) <= set(phases)
    for name in ("mhc", "attention", "collective", "moe", "head", "sampler", "commit"):
        assert phases[name]["us"] > 0, name
    b = rec["bytes_per_token"]
    # one rank owns every expert: each layer runs its k routed experts per token
    assert b["local_expert_runs_per_token"] == cfg.num_experts_per_tok * cfg.num_hidden_layers
    experts = model.transformer.layers[-1]["ffn"]["experts"]
    one = sum(w.data.numel() * w.data.element_size() for w in experts.values()) // experts["w1"].data.shape[0]
    assert b["routed_experts"] == b["local_expert_runs_per_token"] * one
    head = model.transformer.head_w.data
    assert b["head"] >= head.numel() * head.element_size()
    assert b["total"] == b["dense"] + b["routed_experts"] + b["head"] + b["embedding_row"] + b["cache"]
    assert state.host_pos == 29 + 3
