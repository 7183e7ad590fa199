"""The OpenAI surface of `dsv4 serve` beyond one prompt and one choice, on the tiny preset (CPU), driven
by the `openai` client where it can send the request.

Checked: n choices (choice j is the n=1 answer of seed + j, streamed chunks name their index) on both
endpoints, batch prompts (indexes i * n + j), echo, best_of == n, ignore_eos, the developer role and an
assistant's null content, top_k -1; /version, /tokenize, /detokenize; --api-key (401 everywhere but
/health); wrong types in every field and bodies that are not JSON objects answer an OpenAI-shaped 4xx;
a 10 MB prompt is refused at once naming both lengths while a small request is served (the bound on
its tokens from its bytes is a true lower bound), and a huge /tokenize stalls no stream; a
non-streamed client that leaves frees all its choices' slots; a handler that fails answers a 500,
a stream that fails ends with an error event.
"""

from __future__ import annotations

import threading
import time
from importlib import metadata

import httpx
import openai
import pytest
import torch

import dsv4
import serving
from serving import post, root, running, wait_for
from dsv4.serve import Server, chat_text

NAME = "tiny-surface"
MAX_NUM_SEQS = 6


@pytest.fixture(scope="module")
def model():
    return dsv4.load("tiny", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def server(model):
    with Server(model, "127.0.0.1", 0, model_name=NAME, max_model_len=256, max_num_seqs=MAX_NUM_SEQS) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return serving.client(server, timeout=60)


def by_index(chunks) -> tuple[dict, dict]:
    """Joined text and finish_reason of each choice index of a stream's chunks."""
    text, finish = {}, {}
    for c in chunks:
        for ch in c.choices:
            piece = ch.text if hasattr(ch, "text") else (ch.delta.content or "")
            text[ch.index] = text.get(ch.index, "") + piece
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
    return text, finish


def texts(out) -> list[str]:
    return [c.text if hasattr(c, "text") else c.message.content for c in out.choices]


# ---- n, batch prompts, echo ---------------------------------------------------------------------

def test_n_choices_are_the_single_answers_of_seed_plus_j(client):
    args = dict(model=NAME, prompt="choose", max_tokens=5, temperature=1.0)
    out = client.completions.create(**args, n=3, seed=40)
    assert [c.index for c in out.choices] == [0, 1, 2]
    single = [client.completions.create(**args, seed=40 + j) for j in range(3)]
    assert texts(out) == [texts(s)[0] for s in single]
    assert len(set(texts(out))) > 1  # different draws, not one answer thrice
    assert out.usage.prompt_tokens == single[0].usage.prompt_tokens  # the prompt counts once
    assert out.usage.completion_tokens == sum(s.usage.completion_tokens for s in single)
    text, finish = by_index(client.completions.create(**args, n=3, seed=40, stream=True))
    assert [text[i] for i in range(3)] == texts(out)
    assert [finish[i] for i in range(3)] == [c.finish_reason for c in out.choices]


def test_n_chat_choices_streamed_with_their_index(client):
    args = dict(model=NAME, messages=[{"role": "user", "content": "two answers"}], max_tokens=4, temperature=1.0)
    out = client.chat.completions.create(**args, n=2, seed=7)
    assert [c.index for c in out.choices] == [0, 1]
    assert texts(out) == [texts(client.chat.completions.create(**args, seed=7 + j))[0] for j in range(2)]
    chunks = list(client.chat.completions.create(**args, n=2, seed=7, stream=True))
    roles = [ch.index for c in chunks for ch in c.choices if ch.delta.role == "assistant"]
    assert roles == [0, 1]
    text, _ = by_index(chunks)
    assert [text[0], text[1]] == texts(out)


def test_seed_plus_j_wraps_at_2_64(client):
    args = dict(model=NAME, prompt="wrap", max_tokens=4, temperature=1.0)
    out = client.completions.create(**args, n=2, seed=2**64 - 1)
    assert texts(out)[1] == texts(client.completions.create(**args, seed=0))[0]


def test_n_is_limited_to_max_num_seqs(server):
    r = post(server, "/v1/completions", {"prompt": "x", "n": MAX_NUM_SEQS + 1, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
    assert f"at most {MAX_NUM_SEQS}" in r.json()["error"]["message"]
    r = post(server, "/v1/completions", {"prompt": ["a", "b", "c"], "n": 3, "max_tokens": 1})
    assert r.status_code == 400 and "3 x 3 prompts = 9" in r.json()["error"]["message"], r.text
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"


def test_batch_prompts_index_as_openai(client, model):
    args = dict(model=NAME, max_tokens=4, temperature=1.0, seed=3)
    out = client.completions.create(**args, prompt=["first prompt", "second"], n=2)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]  # prompt i's choice j is i * n + j
    expected = [texts(client.completions.create(**args, prompt=p, n=2)) for p in ("first prompt", "second")]
    assert texts(out) == expected[0] + expected[1]
    ids = [model.tokenizer.encode(p) for p in ("first prompt", "second")]
    assert out.usage.prompt_tokens == sum(map(len, ids))
    by_ids = client.completions.create(**args, prompt=ids, n=2)
    assert texts(by_ids) == texts(out)
    text, _ = by_index(client.completions.create(**args, prompt=["first prompt", "second"], n=2, stream=True))
    assert [text[i] for i in range(4)] == texts(out)


def test_echo_prepends_the_prompt(client, model):
    args = dict(model=NAME, max_tokens=4, seed=9)
    plain = texts(client.completions.create(**args, prompt="echo me"))[0]
    assert texts(client.completions.create(**args, prompt="echo me", echo=True))[0] == "echo me" + plain
    ids = model.tokenizer.encode("echo me", add_bos=False)
    echoed = texts(client.completions.create(**args, prompt=ids, echo=True))[0]
    assert echoed.startswith(model.tokenizer.decode(ids))
    chunks = list(client.completions.create(**args, prompt=["echo me", "b"], echo=True, stream=True))
    assert chunks[0].choices[0].text == "echo me" and chunks[1].choices[0].text == "b"
    assert by_index(chunks)[0][0] == "echo me" + plain


def test_best_of_equal_to_n(client, server):
    out = client.completions.create(model=NAME, prompt="best", max_tokens=2, n=2, best_of=2, seed=1)
    assert len(out.choices) == 2
    r = post(server, "/v1/completions", {"prompt": "best", "best_of": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "best_of", r.text


# ---- ignore_eos, roles, top_k -------------------------------------------------------------------

def test_ignore_eos_samples_through_eos(client, model):
    # Found by search: this prompt and seed sample EOS as their third token.
    args = dict(model=NAME, prompt="the end", max_tokens=6, temperature=2.0, seed=443)
    ids = model.tokenizer.encode("the end")
    tokens = list(model.sample_tokens(ids, 6, dsv4.SamplingParams(temperature=2.0, seed=443)))
    assert tokens.index(model.cfg.eos_token_id) == 2, tokens
    stopped = client.completions.create(**args)
    assert (stopped.choices[0].finish_reason, stopped.usage.completion_tokens) == ("stop", 3)
    through = client.completions.create(**args, extra_body={"ignore_eos": True})
    assert (through.choices[0].finish_reason, through.usage.completion_tokens) == ("length", 6)
    assert through.choices[0].text == model.tokenizer.decode(tokens)
    text, finish = by_index(client.completions.create(**args, stream=True, extra_body={"ignore_eos": True}))
    assert (text[0], finish[0]) == (through.choices[0].text, "length")


def test_developer_role_and_null_assistant_content(client, server, model):
    as_system = [{"role": "system", "content": "rules"}, {"role": "user", "content": "hi"}]
    as_developer = [{"role": "developer", "content": "rules"}, {"role": "user", "content": "hi"}]
    assert chat_text(as_developer) == chat_text(as_system)
    a = client.chat.completions.create(model=NAME, messages=as_developer, max_tokens=3, seed=2)
    b = client.chat.completions.create(model=NAME, messages=as_system, max_tokens=3, seed=2)
    assert texts(a) == texts(b)
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None},
               {"role": "user", "content": "again"}]
    out = client.chat.completions.create(model=NAME, messages=history, max_tokens=2, seed=2)
    assert out.usage.prompt_tokens == len(model.tokenizer.encode(chat_text([{**m, "content": m["content"] or ""}
                                                                           for m in history])))
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": None}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content", r.text


def test_top_k_minus_one_is_off(client):
    args = dict(model=NAME, prompt="k", max_tokens=5, temperature=1.0, seed=12)
    off = texts(client.completions.create(**args))[0]
    assert texts(client.completions.create(**args, extra_body={"top_k": -1}))[0] == off


# ---- /version, /tokenize, /detokenize, --api-key ----------------------------------------------------

def test_version(server):
    assert httpx.get(root(server) + "/version").json() == {"version": metadata.version("dsv4")}


def test_tokenize_and_detokenize(client, server, model):
    tok = model.tokenizer
    r = post(server, "/tokenize", {"model": NAME, "prompt": "hello world"}).json()
    assert r == {"count": len(tok.encode("hello world")), "max_model_len": 256, "tokens": tok.encode("hello world"),
                 "token_strs": None}
    bare = post(server, "/tokenize", {"prompt": "hello world", "add_special_tokens": False,
                                      "return_token_strs": True}).json()
    assert bare["tokens"] == tok.encode("hello world", add_bos=False)
    assert "".join(bare["token_strs"]).replace("Ġ", " ") == "hello world"
    messages = [{"role": "user", "content": "hi"}]
    chat = post(server, "/tokenize", {"messages": messages}).json()
    used = client.chat.completions.create(model=NAME, messages=messages, max_tokens=1).usage.prompt_tokens
    assert chat["tokens"] == tok.encode(chat_text(messages)) and chat["count"] == used
    back = post(server, "/detokenize", {"model": NAME, "tokens": r["tokens"]}).json()
    assert back == {"prompt": tok.decode(r["tokens"], skip_special_tokens=False)}
    assert back["prompt"].endswith("hello world")
    for path, body, param in [("/tokenize", {"prompt": "a", "messages": messages}, "prompt"),
                              ("/tokenize", {}, "prompt"),
                              ("/tokenize", {"prompt": 5}, "prompt"),
                              ("/tokenize", {"messages": messages, "add_special_tokens": True}, "add_special_tokens"),
                              ("/tokenize", {"messages": messages, "add_generation_prompt": False},
                               "add_generation_prompt"),
                              ("/tokenize", {"prompt": "a", "truncate": 3}, "truncate"),
                              ("/detokenize", {"tokens": [1, 10 ** 6]}, "tokens"),
                              ("/detokenize", {"tokens": "1 2"}, "tokens"),
                              ("/detokenize", {"tokens": [True]}, "tokens"),
                              ("/detokenize", {}, "tokens")]:
        r = post(server, path, body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (path, body, r.text)
    assert post(server, "/tokenize", {"model": "other", "prompt": "a"}).status_code == 404


def test_api_key(model):
    with Server(model, "127.0.0.1", 0, model_name=NAME, max_model_len=64, max_num_seqs=1, api_key="sekret") as srv:
        good = openai.OpenAI(base_url=srv.url, api_key="sekret", max_retries=0, timeout=60)
        assert good.completions.create(model=NAME, prompt="hi", max_tokens=1).choices
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=srv.url, api_key="wrong", max_retries=0).models.list()
        assert httpx.get(root(srv) + "/health").status_code == 200
        for method, path in [("GET", "/v1/models"), ("GET", "/metrics"), ("GET", "/version"),
                             ("POST", "/tokenize"), ("POST", "/v1/completions"), ("GET", "/nowhere")]:
            r = httpx.request(method, root(srv) + path, json={"prompt": "a"})
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, r.text)
        r = httpx.get(root(srv) + "/version", headers={"Authorization": "Bearer sekret"})
        assert r.status_code == 200


# ---- the request path: wrong types, huge prompts, disconnects ----------------------------------------

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
WRONG = [  # (field, a wrong value); each must answer a 400 naming the field
    ("model", 5), ("model", ["tiny"]), ("max_tokens", "5"), ("max_tokens", 5.5), ("max_tokens", True),
    ("max_tokens", -3), ("n", "2"), ("n", 1.5), ("n", 0), ("temperature", "hot"), ("temperature", True),
    ("temperature", [1]), ("top_p", 0), ("top_p", "x"), ("top_k", 1.5), ("top_k", "1"), ("seed", 1.5), ("seed", "1"),
    ("seed", True), ("seed", 2**64), ("seed", 10**30), ("stop", 5), ("stop", [5]), ("stop", ["a"] * 5), ("stop", [""]),
    ("stop", {"a": 1}), ("stream", 1), ("stream", "true"), ("stream_options", 5), ("ignore_eos", "yes"),
    ("user", 5), ("logit_bias", "x"), ("logprobs", "yes"), ("frequency_penalty", "high"),
]
WRONG_COMPLETIONS = [("prompt", 5), ("prompt", {"a": 1}), ("prompt", []), ("prompt", [[]]), ("prompt", [1, "a"]),
                     ("prompt", [[1], "a"]), ("prompt", [1.5]), ("prompt", [True]), ("prompt", None),
                     ("prompt", "\ud800"), ("echo", "yes"), ("best_of", "2"), ("suffix", 5)]
WRONG_CHAT = [("messages", "hi"), ("messages", [5]), ("messages", [[]]), ("messages", {"role": "user"}),
              ("messages", None), ("max_completion_tokens", "9")]


@pytest.mark.parametrize("path,name,value", [(COMPLETIONS, *w) for w in WRONG + WRONG_COMPLETIONS]
                         + [(CHAT, *w) for w in WRONG + WRONG_CHAT])
def test_wrong_types_name_the_field(server, path, name, value):
    body = {"messages": [{"role": "user", "content": "x"}]} if path == CHAT else {"prompt": "x"}
    body["max_tokens"] = 2
    body[name] = value
    r = post(server, path, body)
    assert r.status_code == 400 and r.headers["content-type"] == "application/json", (name, value, r.text)
    err = r.json()["error"]
    assert err["param"].split("[")[0].split(".")[0] == name and err["type"] == "invalid_request_error", err


@pytest.mark.parametrize("message,param", [
    ({"role": "user"}, "messages[0].content"), ({"role": "user", "content": 5}, "messages[0].content"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, "messages[0].content"),
    ({"role": 5, "content": "x"}, "messages[0].role"), ({"content": "x"}, "messages[0].role"),
    ({"role": "function", "content": "x"}, "messages[0].role"), ({"role": "tool", "content": "x"}, "messages[0]"),
    ({"role": "user", "content": "\ud800"}, "messages"),
])
def test_wrong_messages_name_the_field(server, message, param):
    r = post(server, CHAT, {"messages": [message]})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize("raw", [b"", b"null", b"5", b'"text"', b"[]", b"true", b'{"prompt": NaN}',
                                 b'{"prompt": "x", "seed": ' + b"9" * 5000 + b"}",
                                 b'{"prompt": "x", "temperature": 1e999}'])
@pytest.mark.parametrize("path", [COMPLETIONS, CHAT, "/tokenize", "/detokenize"])
def test_bodies_that_are_not_objects(server, path, raw):
    r = post(server, path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}, r.text


def test_ten_megabyte_prompt_is_refused_at_once(client, server):
    big = "hello world, and more words " * 360000  # 10 MB: tokenising it would take seconds
    answer = []

    def send():
        start = time.perf_counter()
        answer.append(post(server, COMPLETIONS, {"prompt": big, "max_tokens": 1}))
        answer.append(time.perf_counter() - start)

    t = threading.Thread(target=send)
    t.start()
    start = time.perf_counter()
    small = client.completions.create(model=NAME, prompt="small", max_tokens=2, seed=1)
    small_s = time.perf_counter() - start
    t.join(60)
    assert small.choices and small_s < 10
    error = answer[0].json()["error"]
    assert answer[0].status_code == 400 and error["code"] == "context_length_exceeded", answer[0].text
    assert f"{len(big)} bytes" in error["message"] and "max_model_len 256" in error["message"]
    assert answer[1] < 5  # refused by its size, not after tokenising


def test_huge_tokenize_does_not_stall_a_stream(client, server):
    big = "hello world, and more words " * 50000  # 1.4 MB: a second or more of tokenisation
    stamps, answer = [], []

    def send():
        start = time.perf_counter()
        answer.append(post(server, "/tokenize", {"prompt": big}))
        answer.append((start, time.perf_counter()))

    stream = client.completions.create(model=NAME, prompt="keep going", max_tokens=60, seed=9, stream=True)
    it = iter(stream)
    next(it)
    t = threading.Thread(target=send)
    t.start()
    for _ in it:
        stamps.append(time.perf_counter())
    t.join(60)
    assert answer[0].status_code == 200 and answer[0].json()["count"] > 100000
    start, end = answer[1]
    gaps = [b - a for a, b in zip(stamps, stamps[1:]) if b > start and a < end]
    assert gaps and max(gaps) < max(0.5, (end - start) / 2), (gaps, end - start)


def test_a_non_streamed_client_that_leaves_frees_every_choice(client, server):
    with pytest.raises(httpx.ReadTimeout):
        post(server, COMPLETIONS, {"prompt": "wait for us", "max_tokens": 200, "n": 3, "seed": 2}, timeout=0.5)
    wait_for(lambda: running(server) == 0, 5)
    start = time.perf_counter()
    assert client.completions.create(model=NAME, prompt="next", max_tokens=2, seed=3).choices
    assert time.perf_counter() - start < 10


def test_the_byte_bound_never_exceeds_the_token_count(model):
    """The bound that refuses a prompt before tokenising it is a lower bound on its tokens."""
    import random

    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import normalizers

    from dsv4.serve.protocol import _longest_token_bytes
    from dsv4.tokenizer import Tokenizer

    tok, rng = model.tokenizer, random.Random(1)
    longest = _longest_token_bytes(tok)
    pieces = ["<｜end▁of▁sentence｜>", "<｜User｜>", "   ", "\n\n", "日本語", "🎉", "the river", "Ġ", "0123456789"]
    for _ in range(200):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 60)))
        assert len(tok.encode(text)) >= len(text.encode()) // (2 * longest), text
    copy = Tokenizer(HFTokenizer.from_str(tok.tok.to_str()))
    copy.tok.normalizer = normalizers.NFKC()  # may shrink text: no bound at all
    assert _longest_token_bytes(copy) is None


def test_a_failing_handler_answers_500_and_a_failing_stream_an_error_event(client, server, monkeypatch):
    from dsv4.serve import protocol, server as server_module

    def broken(*_):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(protocol, "parse", broken)
    r = post(server, COMPLETIONS, {"prompt": "x"})
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error" and "boom" in r.text
    monkeypatch.undo()
    monkeypatch.setattr(server_module.TextStream, "push", broken)
    r = post(server, COMPLETIONS, {"prompt": "x", "max_tokens": 3, "stream": True})
    events = [line for line in r.text.splitlines() if line.startswith("data: ")]
    assert r.status_code == 200 and "boom" in events[-2] and events[-1] == "data: [DONE]", r.text
    wait_for(lambda: running(server) == 0, 5)


def test_choices_are_queued_all_or_none(model):
    with Server(model, "127.0.0.1", 0, model_name=NAME, max_model_len=64, max_num_seqs=2, max_waiting=0) as srv:
        c = openai.OpenAI(base_url=srv.url, api_key="none", max_retries=0, timeout=60)
        stream = c.completions.create(model=NAME, prompt="hold a slot", max_tokens=50, seed=1, stream=True)
        next(iter(stream))
        r = post(srv, COMPLETIONS, {"prompt": "two", "n": 2, "max_tokens": 2})
        assert r.status_code == 429 and r.headers["retry-after"].isdigit(), r.text
        wait_for(lambda: running(srv) == 1, 5)  # the choice that found a slot was let go
        stream.close()
        wait_for(lambda: running(srv) == 0, 5)
        assert len(c.completions.create(model=NAME, prompt="two", n=2, max_tokens=2).choices) == 2
