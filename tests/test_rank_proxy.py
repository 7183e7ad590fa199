"""benchmarks/rank_proxy.py (one rank of an N-rank model alone on one device, its collectives kept on the rank) on
`tiny`, CPU: with world 1 it is the model dsv4.load builds, bit for bit; with world 2 it holds rank r's heads, experts
and vocabulary slice, runs every door (the census) and tiles its logits; the script's records."""

from __future__ import annotations

import json

import pytest
import torch

import benchmarks.rank_proxy as proxy
import dsv4

SP = dsv4.SamplingParams(temperature=1.0, seed=11)
IDS = [5, 17, 99, 3, 250, 41, 7]


def stream(model, steps=6):
    state = model.new_state(len(IDS) + steps + 1)
    model.prefill(state, IDS)
    token, out = model.draw(state, SP), []
    for _ in range(steps):
        token = model.step(state, token, SP)
        out.append(token)
    return out, model.logits_sha(state)


def test_world_one_is_the_model_load_builds():
    assert stream(proxy.build_proxy("tiny", 1, device="cpu")) == stream(dsv4.load("tiny", device="cpu"))


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_of_two_holds_its_share_and_runs_every_door(rank):
    model = proxy.build_proxy("tiny", 2, rank, device="cpu")
    cfg = model.cfg
    assert model.world == 2 and model.rank == rank
    assert model.transformer.heads == cfg.num_attention_heads // 2
    half = cfg.n_routed_experts // 2
    assert (model.transformer.experts.start, model.transformer.experts.stop) == (rank * half, (rank + 1) * half)
    state = model.new_state(len(IDS) + 2)
    logits = model.prefill(state, IDS)
    assert logits.shape[-1] == cfg.vocab_size
    part = cfg.vocab_size // 2
    assert torch.equal(logits[..., :part], logits[..., part:])  # the all-gather tiles this rank's slice
    before = model.census().clone()
    model.step(state, 9, SP)
    assert int((model.census() - before).sum()) == 2 * cfg.num_hidden_layers  # attention + moe doors, each layer


def test_a_rank_outside_the_world_is_refused():
    with pytest.raises(ValueError, match=r"rank=2 is not in \[0, world=2\)"):
        proxy.LoopbackComm(5, "cpu", 2, 2)


def test_the_script_reports_its_rows_and_estimate(capsys):
    assert proxy.main(["--preset", "tiny", "--world", "2", "--device", "cpu", "--prime", "6", "--steps", "3",
                       "--eager-steps", "3", "--rows", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    recs = {line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1]) for line in out}
    assert recs["RANK_PROXY_BUILD"]["preset"] == "tiny (rank 0 of 2, proxy)"
    summary = recs["RANK_PROXY"]
    assert summary["same_stream"] and summary["eager_tok_s"] > 0
    assert summary["reductions_per_token"] == 2 * dsv4.config.preset("tiny").num_hidden_layers
