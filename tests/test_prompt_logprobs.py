"""A prompt's own log-probabilities: `Model.prefill_scored` (each prefill row's next prompt token, and the most likely
ones, from the step's head) against HF transformers' DeepseekV4ForCausalLM on the same checkpoint, the state it
leaves against a plain prefill's bytes, one rank against two; and over HTTP, completions' `echo` with `logprobs`
(OpenAI's legacy prompt logprobs, lm-eval's loglikelihood requests).

Tolerance against HF (fp32, tiny): max |logprob_dsv4 - logprob_hf| <= 1e-4 (measured ~1e-6: summation order only);
the top ids equal. Two ranks against one: 1e-4 (the vocab-parallel head and the all-reduces sum in another order)."""

from __future__ import annotations

import types

import openai
import pytest
import torch

import dsv4
import serving
from dsv4.checkpoint.synth import synth
from dsv4.config import preset
from dsv4.serve import Server, protocol

TOL = 1e-4
N = 40  # prompt tokens: two full 16-token chunks and a part of one, across sliding and compressed windows


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return synth(preset("tiny"), tmp_path_factory.mktemp("scored") / "tiny", seed=7, quant="none")


@pytest.fixture(scope="module")
def model(checkpoint):
    return dsv4.load(checkpoint, device="cpu", dtype=torch.float32)


def prompt(model, n=N, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, model.cfg.vocab_size, (n,), generator=g).tolist()


def scored(model, ids, top=3, chunk=16):
    """ids[:-1] prefilled in chunks, each row scored on the next prompt token -> (scores, the state)."""
    state = model.new_state(64)
    out = []
    for a in range(0, len(ids) - 1, chunk):
        piece = ids[a:min(a + chunk, len(ids) - 1)]
        out += model.prefill_scored(state, piece, ids[a + 1:a + 1 + len(piece)], top)
    return out, state


def test_prompt_logprobs_are_hfs(model, checkpoint):
    transformers = pytest.importorskip("transformers")
    hf = transformers.DeepseekV4ForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).float().eval()
    ids = prompt(model)
    scores, _ = scored(model, ids)
    with torch.no_grad():
        lp = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)[:-1]
    ref = lp.gather(-1, torch.tensor(ids[1:]).view(-1, 1)).view(-1)
    assert len(scores) == N - 1
    assert float((torch.tensor([s.logprob for s in scores]) - ref).abs().max()) <= TOL
    top = lp.topk(3, dim=-1)
    assert [[i for i, _ in s.top] for s in scores] == top.indices.tolist()
    assert [s.rank for s in scores] == ((lp > ref.view(-1, 1)).sum(dim=-1) + 1).tolist()
    assert float((torch.tensor([[v for _, v in s.top] for s in scores]) - top.values).abs().max()) <= TOL


def test_the_state_is_a_plain_prefills(model):
    ids = prompt(model, seed=1)
    _, state = scored(model, ids, top=0)
    plain = model.new_state(64)
    for a in range(0, len(ids) - 1, 16):
        model.prefill(plain, ids[a:min(a + 16, len(ids) - 1)])
    assert state.digest() == plain.digest() and torch.equal(state.logits, plain.logits)
    sampling = dsv4.SamplingParams(temperature=1.0, seed=3)
    assert [model.step(state, ids[-1], sampling)] == [model.step(plain, ids[-1], sampling)]


def test_a_refused_scored_prefill_commits_nothing(model):
    ids = prompt(model, seed=2)
    state = model.new_state(64)
    model.prefill(state, ids[:16])
    before = state.digest()
    model.arm_refusal(1, 0, 7, "moe")
    try:
        with pytest.raises(dsv4.RefusalError, match="layer 1 site moe"):
            model.prefill_scored(state, ids[16:32], ids[17:33], 2)
    finally:
        model.reset_refusals()
    assert state.digest() == before and state.quarantine is not None


def test_bad_calls_name_what(model):
    state = model.new_state(16)
    with pytest.raises(ValueError, match="3 tokens and 2 targets"):
        model.prefill_scored(state, [5, 6, 7], [6, 7])
    with pytest.raises(ValueError, match="top -1"):
        model.prefill_scored(state, [5], [6], top=-1)
    with pytest.raises(ValueError, match="targets: token id"):
        model.prefill_scored(state, [5], [model.cfg.vocab_size])


def test_two_ranks_score_as_one(model, checkpoint):
    ids = prompt(model, seed=4)
    one, _ = scored(model, ids)
    two = dsv4.load(checkpoint, device="cpu", dtype=torch.float32, ranks=2)
    try:
        got, _ = scored(two, ids)
    finally:
        two.close()
    assert float(torch.tensor([[a.logprob - b.logprob] for a, b in zip(one, got)]).abs().max()) <= TOL
    assert [s.rank for s in one] == [s.rank for s in got]
    assert [[i for i, _ in s.top] for s in one] == [[i for i, _ in s.top] for s in got]


# ---- over HTTP: completions' echo with logprobs -------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(model):
    with Server(model, "127.0.0.1", 0, model_name="scored", max_model_len=256, max_num_seqs=4, prefill_chunk=8,
                prefix_cache=2) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return serving.client(server, timeout=120)


def test_echo_with_logprobs_scores_the_prompt(client, model):
    text = "The quick brown fox jumps over the lazy dog"
    ids = model.tokenizer.encode(text)
    kw = dict(model="scored", prompt=text, max_tokens=4, logprobs=2, seed=5)
    for _ in range(2):  # the second time its prompt is in the prefix cache: a scored prompt runs whole anyway
        echoed = client.completions.create(echo=True, **kw).choices[0]
        lp = echoed.logprobs
        assert echoed.text.startswith(text) and len(lp.tokens) == len(ids) + 4
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        reference, _ = scored(model, ids, top=2, chunk=8)  # the server's chunks (prefill_chunk 8)
        assert lp.token_logprobs[1:len(ids)] == pytest.approx([s.logprob for s in reference], abs=1e-6)
        # keyed by text (OpenAI's shape): two top tokens spelling the same text (a partial character) share a key
        assert all(1 <= len(t) <= 2 for t in lp.top_logprobs[1:len(ids)])
    plain = client.completions.create(**kw).choices[0]  # the sampled part: the request's without echo
    assert lp.token_logprobs[len(ids):] == plain.logprobs.token_logprobs
    assert echoed.text == text + plain.text
    streamed = [c.choices[0] for c in client.completions.create(echo=True, stream=True, **kw) if c.choices]
    assert [t for c in streamed if c.logprobs for t in c.logprobs.tokens] == lp.tokens


def test_lm_eval_loglikelihood_request(client, model):
    """lm-eval's local-completions loglikelihood: token ids, echo, logprobs 1, max_tokens 1, greedy."""
    ids = prompt(model, n=20, seed=6)
    r = client.completions.create(model="scored", prompt=ids, echo=True, logprobs=1, max_tokens=1, temperature=0)
    lp = r.choices[0].logprobs
    reference, _ = scored(model, ids, top=1, chunk=8)
    assert lp.token_logprobs[1:len(ids)] == pytest.approx([s.logprob for s in reference], abs=1e-6)
    greedy = [max(t.values()) == v for t, v in zip(lp.top_logprobs[1:len(ids)], lp.token_logprobs[1:len(ids)])]
    assert greedy == [s.rank == 1 for s in reference] == [s.top[0][0] == i for s, i in zip(reference, ids[1:])]


def test_vllm_prompt_logprobs(server, model):
    """vLLM's prompt_logprobs: [null, {token id: {logprob, rank, decoded_token}}, ...] on each completions choice and
    on the chat response, the prompt token's entry and its k most likely."""
    text = "a lazy dog sleeps"
    ids = model.tokenizer.encode(text)
    r = serving.post(server, "/v1/completions", {"prompt": text, "max_tokens": 2, "prompt_logprobs": 2,
                                                                "seed": 1, "n": 2}).json()
    reference, _ = scored(model, ids, top=2, chunk=8)
    for choice in r["choices"]:
        lp = choice["prompt_logprobs"]
        assert lp[0] is None and len(lp) == len(ids)
        for entry, score, token in zip(lp[1:], reference, ids[1:]):
            assert entry[str(token)]["logprob"] == pytest.approx(score.logprob, abs=1e-6)
            assert entry[str(token)]["rank"] == score.rank
            assert {int(t) for t in entry} == {token, *(i for i, _ in score.top)}
            assert sorted(e["rank"] for t, e in entry.items() if int(t) != token or score.rank <= 2)[:2] == [1, 2]
    messages = [{"role": "user", "content": "hi"}]
    r = serving.post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 2,
                                                                     "prompt_logprobs": 0}).json()
    assert r["prompt_logprobs"][0] is None and len(r["prompt_logprobs"]) == r["usage"]["prompt_tokens"]
    assert all(len(e) == 1 for e in r["prompt_logprobs"][1:])
    for body in ({"stream": True}, {"echo": True, "logprobs": 1}):
        bad = serving.post(server, "/v1/completions", {"prompt": "x", "max_tokens": 1,
                                                                      "prompt_logprobs": 1, **body})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt_logprobs"


def test_echo_with_logprobs_refused_on_cuda_unless_unchecked(model, monkeypatch):
    cuda = types.SimpleNamespace(cfg=model.cfg, tokenizer=model.tokenizer, device=torch.device("cuda"))
    body = {"prompt": "hi", "echo": True, "logprobs": 1}
    monkeypatch.delenv("DSV4_UNCHECKED_SAMPLING", raising=False)
    with pytest.raises(protocol.RequestError) as e:
        protocol.parse(body, cuda, 256, False, 8)
    assert e.value.param == "echo" and "not yet available on CUDA" in e.value.message
    assert protocol.parse({"prompt": "hi", "echo": True}, cuda, 256, False, 8).prompt_logprobs is None
    monkeypatch.setenv("DSV4_UNCHECKED_SAMPLING", "1")
    assert protocol.parse(body, cuda, 256, False, 8).prompt_logprobs == 1


def test_echo_stays_refused_nowhere_else(client):
    with pytest.raises(openai.BadRequestError):  # logprobs over completions' limit, echoed or not
        client.completions.create(model="scored", prompt="x", echo=True, logprobs=9, max_tokens=1)


def test_the_scored_prefill_waits_for_its_gpu_run(model, monkeypatch):
    """On CUDA prefill_scored is off until score_check.py has run there (engine.SCORED_GPU_CHECKED); the refusal
    comes before any device work, so a CPU model that says it is on CUDA shows it."""
    from dsv4 import engine

    monkeypatch.setattr(engine, "SCORED_GPU_CHECKED", False)
    monkeypatch.setattr(model, "device", torch.device("cuda"))
    with pytest.raises(RuntimeError, match="not yet run on a GPU"):
        model.prefill_scored(None, [5], [6])  # refused before the state is read
