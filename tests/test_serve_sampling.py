"""The sampler-side OpenAI fields over HTTP (tiny, CPU, the openai client): logit_bias, penalties, min_p,
logprobs in chat's and completions' shapes (streamed and not), response_format JSON and vLLM's structured_outputs
(json, regex, choice, grammar, json_object) by xgrammar, and the CUDA refusal of a grammar (its mask not yet
GPU-checked) without DSV4_UNCHECKED_SAMPLING=1."""

from __future__ import annotations

import json
import math
import re
import types

import openai
import pytest
import torch

import dsv4
import serving
from dsv4.serve import Server, protocol

NAME = "tiny-sampling"
MESSAGES = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "blue"]}},
          "required": ["ok", "color"]}


@pytest.fixture(scope="module")
def model():
    return dsv4.load("tiny", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def server(model):
    with Server(model, "127.0.0.1", 0, model_name=NAME, max_model_len=256, max_num_seqs=8) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return serving.client(server, timeout=120)


def test_logit_bias_forces_a_token(client, model):
    for temperature in (0.0, 1.0):
        r = client.completions.create(model=NAME, prompt="hi", max_tokens=5, seed=3, temperature=temperature,
                                      logit_bias={"77": 100})
        assert r.choices[0].text == model.tokenizer.decode([77]) * 5


def test_penalties_change_the_text_and_keep_seeded_reproducibility(client):
    def text(**kw):
        return client.completions.create(model=NAME, prompt="hello", max_tokens=24, temperature=0, **kw).choices[0].text

    plain = text()
    assert text(presence_penalty=2.0) != plain and text(frequency_penalty=2.0) != plain
    assert text(extra_body={"repetition_penalty": 1.9}) != plain  # vLLM's fields go as extra_body
    assert text(presence_penalty=2.0) == text(presence_penalty=2.0)


def test_min_p_near_one_is_greedy(client):
    greedy = client.completions.create(model=NAME, prompt="hi", max_tokens=8, temperature=0).choices[0].text
    for seed in (1, 2):
        r = client.completions.create(model=NAME, prompt="hi", max_tokens=8, temperature=1.5, seed=seed,
                                      extra_body={"min_p": 0.999})
        assert r.choices[0].text == greedy


def test_completion_logprobs_shape(client, model):
    r = client.completions.create(model=NAME, prompt="hi", max_tokens=6, seed=4, logprobs=3, echo=True)
    lp = r.choices[0].logprobs
    k = len(model.tokenizer.encode("hi"))  # with echo the prompt's tokens lead (tests/test_prompt_logprobs.py)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == k + 6
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset[k] == len("hi")  # the sampled tokens after the echo
    for tok, v, top in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:]):
        assert v <= 0 and len(top) <= 3 and sum(math.exp(x) for x in top.values()) <= 1 + 1e-5
    assert "".join(lp.tokens[k:]) == r.choices[0].text[len("hi"):]


def test_chat_logprobs_streamed_equal_whole(client):
    kw = dict(model=NAME, messages=MESSAGES, max_tokens=8, seed=5, logprobs=True, top_logprobs=4)
    whole = client.chat.completions.create(**kw).choices[0].logprobs.content
    chunks = [c for c in client.chat.completions.create(stream=True, **kw) if c.choices]
    streamed = [e for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in whole] and len(whole) == 8
    for e in whole:
        assert len(e.top_logprobs) == 4 and bytes(e.bytes).decode(errors="replace") == e.token
        assert e.logprob <= e.top_logprobs[0].logprob + 1e-6
        assert [t.logprob for t in e.top_logprobs] == sorted((t.logprob for t in e.top_logprobs), reverse=True)


def test_greedy_logprobs_are_the_top_token(client):
    content = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=5, temperature=0,
                                             logprobs=True, top_logprobs=1).choices[0].logprobs.content
    for e in content:
        assert e.token == e.top_logprobs[0].token and e.logprob == pytest.approx(e.top_logprobs[0].logprob)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_json_schema_output_is_valid(client, stream, seed):
    kw = dict(model=NAME, messages=MESSAGES, max_tokens=80, seed=seed, temperature=1.0,
              response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}})
    if stream:
        chunks = [c for c in client.chat.completions.create(stream=True, **kw) if c.choices]
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason][-1]
    else:
        choice = client.chat.completions.create(**kw).choices[0]
        text, finish = choice.message.content, choice.finish_reason
    value = json.loads(text)
    assert finish == "stop" and set(value) == {"ok", "color"}
    assert isinstance(value["ok"], bool) and value["color"] in ("red", "blue")


def test_json_object_output_is_an_object(client):
    r = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=200, temperature=0.0,
                                       response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict) and r.choices[0].finish_reason == "stop"


def test_a_schema_xgrammar_refuses_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=MESSAGES, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}})
    assert "response_format.json_schema.schema" in str(e.value)


def test_batched_requests_with_processors_equal_their_solo_runs(client):
    """Requests with different processors (and one without) together equal each alone."""
    import concurrent.futures

    bodies = [dict(presence_penalty=1.0, logprobs=2), dict(), dict(logit_bias={"9": 5}, extra_body={"min_p": 0.05}),
              dict(extra_body={"repetition_penalty": 1.5}, frequency_penalty=0.3)]

    def run(kw):
        r = client.completions.create(model=NAME, prompt="once", max_tokens=12, seed=7, **kw)
        lp = r.choices[0].logprobs
        return r.choices[0].text, None if lp is None else lp.token_logprobs

    solo = [run(kw) for kw in bodies]
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(run, bodies))
    assert together == solo


@pytest.mark.parametrize("field,value", [("presence_penalty", 0.5), ("logit_bias", {"3": 1}), ("min_p", 0.1),
                                         ("logprobs", 0), ("repetition_penalty", 1.1)])
def test_gpu_checked_processing_served_on_cuda(model, monkeypatch, field, value):
    cuda = types.SimpleNamespace(cfg=model.cfg, tokenizer=model.tokenizer, device=torch.device("cuda"))
    monkeypatch.delenv("DSV4_UNCHECKED_SAMPLING", raising=False)
    assert protocol.parse({"prompt": "hi", field: value}, cuda, 256, False, 8).prompts


def test_response_format_refused_on_cuda_unless_unchecked(model, monkeypatch):
    cuda = types.SimpleNamespace(cfg=model.cfg, tokenizer=model.tokenizer, device=torch.device("cuda"))
    body = {"prompt": "hi", "response_format": {"type": "json_object"}}
    monkeypatch.delenv("DSV4_UNCHECKED_SAMPLING", raising=False)
    with pytest.raises(protocol.RequestError) as e:
        protocol.parse(body, cuda, 256, False, 8)
    assert e.value.param == "response_format" and "not yet available on CUDA" in e.value.message
    protocol.parse({"prompt": "hi", "response_format": {"type": "text"}}, cuda, 256, False, 8)  # neutral
    monkeypatch.setenv("DSV4_UNCHECKED_SAMPLING", "1")
    assert protocol.parse(body, cuda, 256, False, 8).prompts


@pytest.mark.parametrize("structured,check", [
    ({"choice": ["yes", "no", "maybe not"]}, lambda t: t in ("yes", "no", "maybe not")),
    ({"regex": "[0-9]{3}-[a-z]{2,4}"}, lambda t: re.fullmatch("[0-9]{3}-[a-z]{2,4}", t)),
    ({"grammar": 'root ::= "(" item ("," item)* ")"\nitem ::= "a" | "bb"'},
     lambda t: re.fullmatch(r"\((a|bb)(,(a|bb))*\)", t)),
    ({"json": json.dumps(SCHEMA)}, lambda t: set(json.loads(t)) == {"ok", "color"}),
    ({"json_object": True}, lambda t: isinstance(json.loads(t), dict)),  # greedy below: random keys run long
], ids=["choice", "regex", "grammar", "json", "json_object"])
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_structured_outputs_hold_the_text(client, structured, check, chat):
    """vLLM's structured_outputs (extra_body): the whole text is a sentence of it, ended by the grammar (stop)."""
    for seed in (1, 2):
        kw = dict(model=NAME, max_tokens=200, seed=seed, extra_body={"structured_outputs": structured},
                  temperature=0.0 if "json_object" in structured else 1.0)
        if chat:
            choice = client.chat.completions.create(messages=MESSAGES, **kw).choices[0]
            text = choice.message.content
        else:
            choice = client.completions.create(prompt="answer:", **kw).choices[0]
            text = choice.text
        assert choice.finish_reason == "stop" and check(text), (structured, text)


@pytest.mark.parametrize("structured,param,words", [
    ({"choice": []}, "structured_outputs", "non-empty list"),
    ({"regex": "("}, "structured_outputs.regex", "parenthesis"),
    ({"grammar": "root ::= "}, "structured_outputs.grammar", "EBNF"),
    ({"json": {"type": "no-such-type"}}, "structured_outputs.json", "no-such-type"),
    ({"whitespace_pattern": " "}, "structured_outputs", "whitespace_pattern: not supported"),
    ({"regex": "a", "choice": ["b"]}, "structured_outputs", "exactly one"),
])
def test_structured_outputs_refusals_name_the_field(client, structured, param, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=NAME, prompt="x", max_tokens=4, extra_body={"structured_outputs": structured})
    error = e.value.body
    assert error["param"] == param and words in error["message"], error


def test_one_grammar_a_reply(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=4, response_format={
            "type": "json_object"}, extra_body={"structured_outputs": {"choice": ["a"]}})
    assert e.value.body["param"] == "structured_outputs"


def test_structured_outputs_refused_on_cuda_unless_unchecked(model, monkeypatch):
    cuda = types.SimpleNamespace(cfg=model.cfg, tokenizer=model.tokenizer, device=torch.device("cuda"))
    body = {"prompt": "hi", "structured_outputs": {"choice": ["a", "b"]}}
    monkeypatch.delenv("DSV4_UNCHECKED_SAMPLING", raising=False)
    with pytest.raises(protocol.RequestError) as e:
        protocol.parse(body, cuda, 256, False, 8)
    assert e.value.param == "structured_outputs" and "not yet available on CUDA" in e.value.message
    monkeypatch.setenv("DSV4_UNCHECKED_SAMPLING", "1")
    assert protocol.parse(body, cuda, 256, False, 8).grammar is not None
