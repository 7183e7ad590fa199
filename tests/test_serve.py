"""`dsv4 serve`: the OpenAI API over HTTP, on the tiny preset (CPU), driven by the `openai` client.

The server (FastAPI + uvicorn, one scheduler thread) runs in a thread on an ephemeral port.
Checked: /v1/models, /health, /metrics; a seeded completion equals the engine's own sampled stream
and the greedy one argmax decoding; streams join to the non-streamed text (usage only with
stream_options.include_usage); chat goes through DeepSeek's chat encoding; stop strings cut the
text; 8 concurrent streams each equal their solo stream (and, with short prefill chunks, prefill in grouped
forwards); a client leaving mid-stream (or before a
non-streamed answer) frees its slot and the next request is served; a full queue answers 429 with
Retry-After; every OpenAI request field is either honoured or refused with a 400 naming it
(tests/test_serve_surface.py: n, batch prompts, echo, the other endpoints, the request path's errors).
"""

from __future__ import annotations

import threading
import time
import typing

import httpx
import openai
import pytest
import torch

import dsv4
import serving
from serving import post, root, running, wait_for
from dsv4.serve import Server, chat_text

NAME = "tiny-test"


@pytest.fixture(scope="module")
def model():
    return dsv4.load("tiny", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def server(model):
    with Server(model, "127.0.0.1", 0, model_name=NAME, max_model_len=256, max_num_seqs=8) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return serving.client(server, timeout=60)


def engine_stream(model, ids, n, sampling):
    out = []
    for t in model.sample_tokens(ids, n, sampling):
        if t == model.cfg.eos_token_id:
            break
        out.append(t)
    return out


def stream_text(stream) -> tuple[str, str, list]:
    chunks = list(stream)
    pieces = [c.choices[0].text if hasattr(c.choices[0], "text") else (c.choices[0].delta.content or "")
              for c in chunks if c.choices]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    return "".join(pieces), finish[-1], chunks


def test_models_health_metrics(server, client):
    assert [m.id for m in client.models.list().data] == [NAME]
    health = httpx.get(root(server) + "/health").json()
    assert health["status"] == "ok"
    client.completions.create(model=NAME, prompt="count me", max_tokens=3, seed=1)
    r = httpx.get(root(server) + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    for name in ("dsv4_num_requests_running", "dsv4_num_requests_waiting", "dsv4_prompt_tokens_total",
                 "dsv4_generation_tokens_total", "dsv4_time_to_first_token_seconds_bucket",
                 "dsv4_time_per_output_token_seconds_bucket", "dsv4_requests_finished_total",
                 "dsv4_e2e_request_latency_seconds_bucket", "dsv4_request_queue_time_seconds_bucket"):
        assert f'{name}{{' in r.text, name
    line = next(x for x in r.text.splitlines() if x.startswith("dsv4_generation_tokens_total{"))
    assert float(line.split()[-1]) >= 3

    def value(prefix):
        return float(next(x for x in httpx.get(root(server) + "/metrics").text.splitlines()
                          if x.startswith(prefix + "{")).split()[-1])

    before = {k: value(k) for k in ("dsv4_e2e_request_latency_seconds_count", "dsv4_request_queue_time_seconds_count",
                                    "dsv4_e2e_request_latency_seconds_sum")}
    client.completions.create(model=NAME, prompt="count me twice", max_tokens=2, seed=1, n=2)
    assert value("dsv4_e2e_request_latency_seconds_count") == before["dsv4_e2e_request_latency_seconds_count"] + 2
    assert value("dsv4_request_queue_time_seconds_count") == before["dsv4_request_queue_time_seconds_count"] + 2
    assert value("dsv4_e2e_request_latency_seconds_sum") > before["dsv4_e2e_request_latency_seconds_sum"]


def test_seeded_completion_is_the_engines_stream(client, model):
    out = client.completions.create(model=NAME, prompt="hello there", max_tokens=12, temperature=1.0, seed=7)
    ids = model.tokenizer.encode("hello there")
    expected = engine_stream(model, ids, 12, dsv4.SamplingParams(temperature=1.0, seed=7))
    assert out.object == "text_completion" and out.model == NAME
    assert out.choices[0].text == model.tokenizer.decode(expected)
    assert out.choices[0].finish_reason == ("length" if len(expected) == 12 else "stop")
    assert out.usage.prompt_tokens == len(ids)
    assert out.usage.completion_tokens == min(12, len(expected) + 1)
    again = client.completions.create(model=NAME, prompt="hello there", max_tokens=12, temperature=1.0, seed=7)
    assert again.choices[0].text == out.choices[0].text  # the sampler is keyed by (seed, position)


def test_greedy_completion_from_token_ids(client, model):
    ids = model.tokenizer.encode("abc")
    out = client.completions.create(model=NAME, prompt=ids, max_tokens=6, temperature=0)
    state = model.new_state(len(ids) + 6)
    logits = model.prefill(state, ids)
    greedy = []
    for _ in range(6):
        t = int(logits.reshape(-1, model.cfg.vocab_size)[-1].argmax())
        if t == model.cfg.eos_token_id:
            break
        greedy.append(t)
        logits = model.decode(state, t)
    assert out.choices[0].text == model.tokenizer.decode(greedy)


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("usage", [False, True])
def test_stream_joins_to_the_whole_response(client, chat, usage):
    if chat:
        create, args = client.chat.completions.create, {"messages": [{"role": "system", "content": "be brief"},
                                                                     {"role": "user", "content": "hi"}]}
    else:
        create, args = client.completions.create, {"prompt": "stream me"}
    args.update(model=NAME, max_tokens=10, seed=3)
    whole = create(**args)
    extra = {"stream_options": {"include_usage": True}} if usage else {}
    text, finish, chunks = stream_text(create(**args, stream=True, **extra))
    assert len({c.id for c in chunks}) == 1
    assert finish == whole.choices[0].finish_reason
    assert text == (whole.choices[0].message.content if chat else whole.choices[0].text)
    if usage:
        assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
        assert all(c.usage is None for c in chunks[:-1])
    else:
        assert all(c.usage is None and c.choices for c in chunks)
    if chat:
        assert chunks[0].choices[0].delta.role == "assistant"
        assert whole.object == "chat.completion" and chunks[0].object == "chat.completion.chunk"


def test_chat_uses_deepseek_chat_encoding(client, model):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                {"role": "user", "content": [{"type": "text", "text": "again"}]}]
    assert chat_text(messages) == ("<｜User｜>hi<｜Assistant｜></think>hello<｜end▁of▁sentence｜>"
                                   "<｜User｜>again<｜Assistant｜></think>")
    out = client.chat.completions.create(model=NAME, messages=messages, max_tokens=5, seed=11)
    ids = model.tokenizer.encode(chat_text(messages))
    assert out.usage.prompt_tokens == len(ids)
    expected = engine_stream(model, ids, 5, dsv4.SamplingParams(seed=11))
    assert (out.choices[0].message.role, out.choices[0].message.content) == ("assistant",
                                                                            model.tokenizer.decode(expected))


def test_stop_string_cuts_the_text(client):
    base = {"model": NAME, "prompt": "stop test", "max_tokens": 20, "seed": 5}
    full = client.completions.create(**base).choices[0].text
    cut = next((i for i in range(3, len(full) - 1) if full[i:i + 2].strip() and full.find(full[i:i + 2]) == i), None)
    if cut is None:
        pytest.fail(f"no usable stop string in {full!r}")
    stop = full[cut:cut + 2]
    out = client.completions.create(**base, stop=[stop])
    assert (out.choices[0].text, out.choices[0].finish_reason) == (full[:cut], "stop")
    text, finish, _ = stream_text(client.completions.create(**base, stop=stop, stream=True))
    assert (text, finish) == (full[:cut], "stop")


@pytest.mark.parametrize("chat", [False, True])
def test_return_token_ids_are_the_sampled_tokens(client, model, chat):
    if chat:
        create, args = client.chat.completions.create, {"messages": [{"role": "user", "content": "ids please"}]}
    else:
        create, args = client.completions.create, {"prompt": "ids please"}
    args.update(model=NAME, max_tokens=12, temperature=1.0, seed=11, extra_body={"return_token_ids": True})
    whole = create(**args)
    ids, prompt = whole.choices[0].token_ids, whole.choices[0].prompt_token_ids
    assert len(ids) == whole.usage.completion_tokens and len(prompt) == whole.usage.prompt_tokens
    if not chat:
        assert prompt == model.tokenizer.encode("ids please")
    expected = engine_stream(model, prompt, 12, dsv4.SamplingParams(temperature=1.0, seed=11))
    assert ids[:len(expected)] == expected and ids[len(expected):] in ([], [model.cfg.eos_token_id])
    chunks = [c for c in create(**args, stream=True) if c.choices]
    assert sum((c.choices[0].token_ids for c in chunks), []) == ids  # none lost to an empty text delta
    assert all(len(c.choices[0].token_ids) <= 1 for c in chunks)  # a chunk per token, as it is sampled
    assert [c.choices[0].prompt_token_ids for c in chunks if getattr(c.choices[0], "prompt_token_ids", None)] \
        == [prompt]
    plain = create(**{k: v for k, v in args.items() if k != "extra_body"})
    assert getattr(plain.choices[0], "token_ids", None) is None


def test_concurrent_streams_equal_their_solo_streams(client, server):
    prompts = [("the river starts high in the hills " * 11, 5)] + [(f"prompt number {i} " * (i + 1), 8)
                                                                  for i in range(7)]
    jobs = [dict(model=NAME, prompt=p, max_tokens=n, temperature=1.0, seed=100 + i)
            for i, (p, n) in enumerate(prompts)]
    solo = [stream_text(client.completions.create(**j, stream=True))[:2] for j in jobs]
    got, spans = [None] * len(jobs), [None] * len(jobs)

    def one(i):
        pieces, first = [], None
        for c in client.completions.create(**jobs[i], stream=True):
            first = first or time.monotonic()
            pieces.append(c)
        got[i] = stream_text(pieces)[:2]
        spans[i] = (first, time.monotonic())

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got == solo
    assert max(s[0] for s in spans) < min(s[1] for s in spans)  # they did run together


def test_concurrent_short_prompts_prefill_together_and_equal_their_solo_streams(model, monkeypatch):
    """8 concurrent requests on a server prefilling 8 tokens a chunk: chunks of one length run in one forward
    (Model.prefill_batch of several states, counted), and each stream equals its stream alone."""
    sizes = []
    real = model.prefill_batch
    monkeypatch.setattr(model, "prefill_batch", lambda states, chunks: sizes.append(len(states)) or real(states, chunks))
    with Server(model, "127.0.0.1", 0, model_name=NAME, max_model_len=128, max_num_seqs=8, prefill_chunk=8) as srv:
        c = serving.client(srv, timeout=60)
        jobs = [dict(model=NAME, prompt=f"short prompt {i} " * (2 + i % 3), max_tokens=4, temperature=1.0,
                     seed=200 + i) for i in range(8)]
        solo = [stream_text(c.completions.create(**j, stream=True))[:2] for j in jobs]
        sizes.clear()
        got = [None] * len(jobs)

        def one(i):
            got[i] = stream_text(c.completions.create(**jobs[i], stream=True))[:2]

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert got == solo
    assert max(sizes) > 1, f"no grouped prefill: forwards of {sizes} states"


def test_disconnects_free_the_slot(client, server):
    # ignore_eos: each request runs its 200 tokens whatever its stream samples (an early EOS would end it first)
    stream = client.completions.create(model=NAME, prompt="leave early", max_tokens=200, seed=1, stream=True,
                                       extra_body={"ignore_eos": True})
    next(iter(stream))
    assert running(server) == 1
    stream.close()
    wait_for(lambda: running(server) == 0)
    with pytest.raises(httpx.ReadTimeout):  # a non-streamed request whose client gives up
        post(server, "/v1/completions", {"prompt": "wait for me", "max_tokens": 200, "seed": 2, "ignore_eos": True},
             timeout=0.5)
    wait_for(lambda: running(server) == 0)
    assert client.completions.create(model=NAME, prompt="next", max_tokens=3, seed=3).usage.completion_tokens >= 1


def test_queue_full_gives_429_with_retry_after(model):
    with Server(model, "127.0.0.1", 0, model_name=NAME, max_model_len=256, max_num_seqs=1, max_waiting=1) as srv:
        c = openai.OpenAI(base_url=srv.url, api_key="none", max_retries=0, timeout=60)
        stream = c.completions.create(model=NAME, prompt="hold the slot", max_tokens=200, seed=1, stream=True)
        next(iter(stream))
        waiter = []
        t = threading.Thread(target=lambda: waiter.append(post(srv, "/v1/completions", {"prompt": "x",
                                                                                        "max_tokens": 2})))
        t.start()
        wait_for(lambda: httpx.get(root(srv) + "/health").json()["waiting"] == 1)
        r = post(srv, "/v1/completions", {"prompt": "y", "max_tokens": 2})
        assert r.status_code == 429 and r.headers["retry-after"].isdigit()
        assert r.json()["error"]["type"] == "rate_limit_error"
        with pytest.raises(openai.RateLimitError):
            c.completions.create(model=NAME, prompt="z", max_tokens=2)
        stream.close()
        t.join(60)
        assert waiter[0].status_code == 200, waiter[0].text
        assert "dsv4_requests_rejected_total" in httpx.get(root(srv) + "/metrics").text


# Every field of the openai client's request types: implemented (protocol.IMPLEMENTED, each accepted with a
# non-default value below), or refused with a 400 naming it unless it holds its neutral value.
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
ACCEPTED = {  # field: the body fields that exercise it
    "model": {"model": NAME}, "prompt": {"prompt": ["hi", "there"]}, "max_tokens": {"max_tokens": 1},
    "max_completion_tokens": {"max_completion_tokens": 1}, "n": {"n": 2}, "best_of": {"n": 2, "best_of": 2},
    "echo": {"echo": True}, "temperature": {"temperature": 0.5}, "top_p": {"top_p": 0.9}, "top_k": {"top_k": 5},
    "seed": {"seed": 2**64 - 1}, "stop": {"stop": ["zz", "yy"]}, "stream": {"stream": True},
    "stream_options": {"stream": True, "stream_options": {"include_usage": True, "include_obfuscation": False}},
    "ignore_eos": {"ignore_eos": True}, "return_token_ids": {"return_token_ids": True}, "user": {"user": "me"}, "safety_identifier": {"safety_identifier": "s"},
    "prompt_cache_key": {"prompt_cache_key": "k"},
    "messages": {"messages": [{"role": "developer", "content": "d"}, {"role": "user", "content": "hi"}]},
    # tool_choice none: DeepSeek-V4's tools section alone is over this server's max_model_len (test_chat.py
    # serves tools in the prompt)
    "tools": {"tools": [TOOL], "tool_choice": "none"}, "tool_choice": {"tools": [TOOL], "tool_choice": "none"},
    "parallel_tool_calls": {"tools": [TOOL], "tool_choice": "none", "parallel_tool_calls": False},
    "chat_template_kwargs": {"chat_template_kwargs": {"thinking": True}}, "thinking": {"thinking": {"type": "enabled"}},
    "reasoning_effort": {"reasoning_effort": "high"},  # "max": its effort prompt is over this max_model_len
    "presence_penalty": {"presence_penalty": 1.0}, "frequency_penalty": {"frequency_penalty": 0.5},
    "repetition_penalty": {"repetition_penalty": 1.2}, "logit_bias": {"logit_bias": {"5": 10}}, "min_p": {"min_p": 0.1},
    "logprobs": {"logprobs": True}, "top_logprobs": {"logprobs": True, "top_logprobs": 3},
    "response_format": {"response_format": {"type": "json_object"}},
    "structured_outputs": {"structured_outputs": {"choice": ["yes", "no"]}},
    "prompt_logprobs": {"prompt_logprobs": 1},
    "stop_token_ids": {"stop_token_ids": [7]}, "min_tokens": {"min_tokens": 1},
    "include_stop_str_in_output": {"stop": ["e"], "include_stop_str_in_output": True},
    "skip_special_tokens": {"skip_special_tokens": True}, "allowed_token_ids": {"allowed_token_ids": [5, 6]},
    "bad_words": {"bad_words": ["the"]},
}
ACCEPTED_COMPLETIONS = {"logprobs": {"logprobs": 2}}  # completions' logprobs is a count, chat's a switch
REFUSED = {
    "suffix": "end", "functions": [{"name": "f"}], "function_call": "auto", "audio": {"voice": "alloy", "format": "mp3"},
    "modalities": ["text", "audio"], "prediction": {"type": "content", "content": "x"},
    "verbosity": "low", "web_search_options": {}, "store": True, "metadata": {"a": "b"}, "service_tier": "flex",
    "moderation": {"model": "m"}, "prompt_cache_options": {}, "prompt_cache_retention": "24h",
    "spaces_between_special_tokens": False,
}


def _fields(module) -> set[str]:
    return set(typing.get_type_hints(module.CompletionCreateParamsBase))


def test_the_field_tables_match_the_request_models():
    from dsv4.serve import protocol

    declared = set(protocol.ChatBody.model_fields) | set(protocol.CompletionBody.model_fields)
    assert set(protocol.IMPLEMENTED) == declared | set(protocol._LABELS)
    assert not set(protocol.IMPLEMENTED) & set(protocol._NEUTRAL)
    assert set(ACCEPTED) == set(protocol.IMPLEMENTED) and set(REFUSED) == set(protocol._NEUTRAL)


@pytest.mark.parametrize("path,fields", [
    ("/v1/completions", _fields(openai.types.completion_create_params)),
    ("/v1/chat/completions", _fields(openai.types.chat.completion_create_params)),
])
def test_every_openai_field_is_honoured_or_refused(server, path, fields):
    from dsv4.serve.protocol import IMPLEMENTED

    unknown = fields - set(IMPLEMENTED) - set(REFUSED)
    assert not unknown, f"decide for {sorted(unknown)}: implement or refuse"
    base = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"}
    base["max_tokens"] = 2
    for name in sorted(fields & set(IMPLEMENTED)):
        fields_of = ACCEPTED_COMPLETIONS.get(name, ACCEPTED[name]) if "chat" not in path else ACCEPTED[name]
        r = post(server, path, {**base, **fields_of})
        assert r.status_code == 200, (name, r.text)
    for name in sorted(fields & set(REFUSED)):
        r = post(server, path, {**base, name: REFUSED[name]})
        assert r.status_code == 400, (name, r.text)
        assert r.json()["error"]["param"] == name and r.json()["error"]["message"].startswith(name + ":"), r.text
    neutral = {"n": 1, "frequency_penalty": 0, "presence_penalty": 0.0, "logit_bias": {}, "user": "me", "top_k": -1,
               **({"logprobs": False, "response_format": {"type": "text"}, "tools": []} if "chat" in path else {})}
    assert post(server, path, {**base, **neutral}).status_code == 200


@pytest.mark.parametrize("path,body,status,words", [
    ("/v1/completions", {"prompt": "x", "max_tokens": 500}, 400, ["max_tokens", "[1, "]),
    ("/v1/completions", {"prompt": "x", "n": 100}, 400, ["n: 100 choices", "at most 8"]),
    ("/v1/completions", {"prompt": "x", "temperature": -1}, 400, ["temperature", "[0.0, 2.0]"]),
    ("/v1/completions", {"prompt": "x", "seed": 2 ** 64}, 400, ["seed", "2**64"]),
    ("/v1/completions", {"prompt": "x", "seed": -1}, 400, ["seed"]),
    ("/v1/completions", {"prompt": "x", "top_k": -2}, 400, ["top_k", "[-1, "]),
    ("/v1/completions", {"prompt": "x", "top_k": 10 ** 6}, 400, ["top_k", "512"]),
    ("/v1/completions", {"prompt": "x", "stream": "yes"}, 400, ["stream: true or false"]),
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, 400, ["stream_options"]),
    ("/v1/completions", {"prompt": "x", "mystery": 1}, 400, ["mystery"]),
    ("/v1/completions", {"prompt": "x", "model": "gpt-4"}, 404, ["'gpt-4'", f"'{NAME}'"]),
    ("/v1/completions", {"prompt": [1, 99999]}, 400, ["99999", "[0, 512)"]),
    ("/v1/completions", {"prompt": ["a", [1]]}, 400, ["prompt: a string"]),
    ("/v1/completions", {"prompt": ["a", "word " * 300]}, 400, ["prompt[1]", "max_model_len 256"]),
    ("/v1/completions", {"prompt": "word " * 200}, 400, ["max_model_len 256"]),
    ("/v1/completions", {"max_tokens": 3}, 400, ["prompt"]),
    ("/v1/completions", {"prompt": "x", "logprobs": 6}, 400, ["logprobs", "[0, 5]"]),
    ("/v1/completions", {"prompt": "x", "logprobs": True}, 400, ["logprobs", "an integer"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
     400, ["top_logprobs", "[0, 20]"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400,
     ["top_logprobs: only with logprobs"]),
    ("/v1/completions", {"prompt": "x", "presence_penalty": 3}, 400, ["presence_penalty", "[-2.0, 2.0]"]),
    ("/v1/completions", {"prompt": "x", "repetition_penalty": 0}, 400, ["repetition_penalty", "> 0"]),
    ("/v1/completions", {"prompt": "x", "min_p": 1.5}, 400, ["min_p"]),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"5": 101}}, 400, ["logit_bias", "[-100, 100]"]),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"x": 1}}, 400, ["logit_bias", "token id"]),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"600": 1}}, 400, ["logit_bias", "600", "[0, 512)"]),
    ("/v1/completions", {"prompt": "x", "response_format": {"type": "xml"}}, 400, ["response_format"]),
    ("/v1/completions", {"prompt": "x", "response_format": {"type": "json_schema"}}, 400,
     ["response_format", "schema"]),
    ("/v1/completions", [1, 2], 400, ["JSON object"]),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, ["messages[0].role"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "name": "a"}]}, 400,
     ["messages[0].name"]),
    ("/v1/chat/completions", {"messages": []}, 400, ["messages"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}, 400,
     ["max_completion_tokens"]),
    ("/v1/embeddings", {"input": "x"}, 404, ["POST /v1/embeddings"]),
])
def test_bad_requests_name_the_field(server, path, body, status, words):
    r = post(server, path, body)
    assert r.status_code == status and r.headers["content-type"] == "application/json"
    message = r.json()["error"]["message"]
    assert all(w in message for w in words), message


@pytest.mark.parametrize("raw", [b"{not json", b"[" * 100000 + b"]" * 100000, b"\xff\xfe"])
def test_body_that_is_not_json(server, raw):
    r = post(server, "/v1/completions", content=raw)
    assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"]


def test_max_model_len_above_the_model_is_refused(model):
    with pytest.raises(ValueError, match="max_position_embeddings is 4096"):
        Server(model, "127.0.0.1", 0, max_model_len=10 ** 6)


def test_port_in_use_is_one_line(model, server):
    port = int(server.url.rsplit(":", 1)[1].removesuffix("/v1"))
    with pytest.raises(ValueError, match=f"cannot listen on 127.0.0.1:{port}"):
        Server(model, "127.0.0.1", port)


def test_the_default_prefix_cache_is_off_only_where_no_prompt_reaches_a_chunk_boundary(model):
    """prefix_cache None (dsv4 serve's default): dsv4.prefix.SERVE_STATES states where the prefill chunk is below
    max_model_len; where it is not (tiny's default chunk at its 4,096 positions; Flash's 4,096 at --max-model-len
    4096) the cache is off and the server says why, where it used to refuse to start; a number asked for is kept,
    and refused where the cache cannot work."""
    from dsv4.prefix import SERVE_STATES

    on = Server(model, port=None, max_model_len=256, prefill_chunk=32, prefix_cache=None)
    assert on.scheduler.prefix.size == SERVE_STATES and on.prefix_note is None
    chunk = model.prefill_chunk(model.cfg.max_position_embeddings)
    assert chunk >= model.cfg.max_position_embeddings  # what made `dsv4 serve --preset tiny` refuse to start
    off = Server(model, port=None, max_model_len=model.cfg.max_position_embeddings, prefix_cache=None,
                 max_num_seqs=1)
    assert off.scheduler.prefix is None
    assert off.prefix_note == (f"prefix cache off: the prefill chunk {chunk} leaves no chunk boundary below "
                               f"max_model_len {model.cfg.max_position_embeddings} (a smaller --prefill-chunk caches "
                               "prefixes at its multiples)")
    with pytest.raises(ValueError, match=f"prefix cache chunk {chunk} >= capacity"):
        Server(model, port=None, max_model_len=model.cfg.max_position_embeddings, prefix_cache=2, max_num_seqs=1)
    with pytest.raises(RuntimeError, match="made without a port"):
        off.start()


def test_cli_serve_starts_and_answers():
    """`dsv4 serve --preset tiny --port 0` prints its URL (and its prefix cache: on by default, dsv4.prefix.SERVE_STATES
    states), answers (with the key of DSV4_API_KEY only), and stops on SIGINT."""
    import os
    import re
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "dsv4.cli", "serve", "--preset", "tiny", "--device", "cpu",
                             "--port", "0", "--served-model-name", "cli-tiny", "--max-num-seqs", "2",
                             "--prefill-chunk", "16"],
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "DSV4_API_KEY": "k3y"})
    try:
        line = proc.stderr.readline()
        url = re.search(r"at (http://\S+/v1)", line)
        assert url, line
        from dsv4.prefix import SERVE_STATES

        assert SERVE_STATES > 0 and f"prefix cache {SERVE_STATES} states at chunks of 16" in line, line
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url.group(1), api_key="none", max_retries=0, timeout=60).models.list()
        c = openai.OpenAI(base_url=url.group(1), api_key="k3y", max_retries=0, timeout=60)
        assert c.models.list().data[0].id == "cli-tiny"
        assert c.completions.create(model="cli-tiny", prompt="hi", max_tokens=3, seed=1).usage.completion_tokens >= 1
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0


def test_a_speculating_server_serves_the_engines_stream(model):
    """--speculate ngram: a request decoding alone takes verify steps where its drafter proposes (the batched step
    where it does not); through the OpenAI client its text is the engine's plain stream, and /metrics counts the
    drafts."""
    with Server(model, "127.0.0.1", 0, model_name=NAME, max_model_len=256, max_num_seqs=2, speculate="ngram",
                draft_tokens=3) as srv:
        prompt = "la la la la la la la la"
        out = serving.client(srv).completions.create(model=NAME, prompt=prompt, max_tokens=16, temperature=1.0, seed=3)
        expected = engine_stream(model, model.tokenizer.encode(prompt), 16, dsv4.SamplingParams(temperature=1.0, seed=3))
        assert out.choices[0].text == model.tokenizer.decode(expected)
        assert "dsv4_spec_decode_num_draft_tokens_total{" in httpx.get(root(srv) + "/metrics").text
