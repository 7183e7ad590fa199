"""`dsv4 serve`: the OpenAI protocol over HTTP, on the tiny preset (CPU).

The server runs in a thread on an ephemeral port; requests go through urllib as a client's would.
Checked: what /v1/models lists; a seeded completion equals the engine's own sampled stream
(Model.step with the same seed) and the greedy one equals argmax decoding; streaming deltas join
to the non-streaming text with the same finish_reason and usage; chat goes through DeepSeek's chat
encoding; stop strings cut the text; bad requests get a 4xx naming the field and the limit.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest
import torch

import dsv4
from dsv4.serve import Server, chat_text


@pytest.fixture(scope="module")
def model():
    return dsv4.load("tiny", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def server(model):
    srv = Server(model, "127.0.0.1", 0, model_name="tiny-test", max_model_len=256)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def call(server, path, body=None, raw: bytes | None = None):
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(server.url.removesuffix("/v1") + path, data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read().decode()


def engine_stream(model, ids, n, sampling):
    state = model.new_state(len(ids) + n)
    model.prefill(state, ids[:-1])
    token, out = ids[-1], []
    for _ in range(n):
        token = model.step(state, token, sampling)
        if token == model.cfg.eos_token_id:
            break
        out.append(token)
    return out


def test_models_and_health(server):
    status, _, text = call(server, "/v1/models")
    assert status == 200
    assert [m["id"] for m in json.loads(text)["data"]] == ["tiny-test"]
    assert call(server, "/health")[0] == 200


def test_seeded_completion_is_the_engines_stream(server, model):
    body = {"model": "tiny-test", "prompt": "hello there", "max_tokens": 12, "temperature": 1.0, "seed": 7}
    status, _, text = call(server, "/v1/completions", body)
    assert status == 200, text
    out = json.loads(text)
    ids = model.tokenizer.encode("hello there")
    expected = engine_stream(model, ids, 12, dsv4.SamplingParams(temperature=1.0, seed=7))
    assert out["object"] == "text_completion" and out["model"] == "tiny-test"
    assert out["choices"][0]["text"] == model.tokenizer.decode(expected)
    finish = out["choices"][0]["finish_reason"]
    assert finish == ("length" if len(expected) == 12 else "stop")
    assert out["usage"]["prompt_tokens"] == len(ids)
    assert out["usage"]["completion_tokens"] == min(12, len(expected) + 1)
    # The same seed again gives the same text (the sampler is keyed by (seed, position)).
    assert json.loads(call(server, "/v1/completions", body)[2])["choices"][0]["text"] == out["choices"][0]["text"]


def test_greedy_completion_from_token_ids(server, model):
    ids = model.tokenizer.encode("abc")
    status, _, text = call(server, "/v1/completions", {"prompt": ids, "max_tokens": 6, "temperature": 0})
    assert status == 200, text
    state = model.new_state(len(ids) + 6)
    logits = model.prefill(state, ids)
    greedy = []
    for _ in range(6):
        t = int(logits.reshape(-1, model.cfg.vocab_size)[-1].argmax())
        if t == model.cfg.eos_token_id:
            break
        greedy.append(t)
        logits = model.decode(state, t)
    assert json.loads(text)["choices"][0]["text"] == model.tokenizer.decode(greedy)


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "stream me", "max_tokens": 10, "seed": 3}),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": "be brief"},
                                           {"role": "user", "content": "hi"}], "max_tokens": 10, "seed": 3}),
])
def test_stream_joins_to_the_whole_response(server, path, body):
    status, _, whole = call(server, path, body)
    assert status == 200, whole
    whole = json.loads(whole)
    status, ctype, text = call(server, path, {**body, "stream": True})
    assert status == 200 and ctype == "text/event-stream"
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    chat = path.endswith("chat/completions")
    pieces = [c["choices"][0]["delta"].get("content", "") if chat else c["choices"][0]["text"] for c in chunks]
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert chunks[-1]["usage"] == whole["usage"]
    got = "".join(pieces)
    assert got == (whole["choices"][0]["message"]["content"] if chat else whole["choices"][0]["text"])
    if chat:
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert whole["object"] == "chat.completion" and chunks[0]["object"] == "chat.completion.chunk"


def test_chat_uses_deepseek_chat_encoding(server, model):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                {"role": "user", "content": [{"type": "text", "text": "again"}]}]
    assert chat_text(messages) == ("<｜User｜>hi<｜Assistant｜></think>hello<｜end▁of▁sentence｜>"
                                   "<｜User｜>again<｜Assistant｜></think>")
    body = {"messages": messages, "max_tokens": 5, "seed": 11}
    out = json.loads(call(server, "/v1/chat/completions", body)[2])
    ids = model.tokenizer.encode(chat_text(messages))
    assert out["usage"]["prompt_tokens"] == len(ids)
    expected = engine_stream(model, ids, 5, dsv4.SamplingParams(seed=11))
    assert out["choices"][0]["message"] == {"role": "assistant", "content": model.tokenizer.decode(expected)}


def test_stop_string_cuts_the_text(server):
    base = {"prompt": "stop test", "max_tokens": 20, "seed": 5}
    full = json.loads(call(server, "/v1/completions", base)[2])["choices"][0]["text"]
    cut = next((i for i in range(3, len(full) - 1) if full[i:i + 2].strip() and full.find(full[i:i + 2]) == i), None)
    if cut is None:
        pytest.fail(f"no usable stop string in {full!r}")
    stop = full[cut:cut + 2]
    for stream in (False, True):
        status, _, text = call(server, "/v1/completions", {**base, "stop": [stop], "stream": stream})
        assert status == 200
        if stream:
            chunks = [json.loads(e.removeprefix("data: ")) for e in text.split("\n\n") if e and "[DONE]" not in e]
            got, finish = "".join(c["choices"][0]["text"] for c in chunks), chunks[-1]["choices"][0]["finish_reason"]
        else:
            got, finish = json.loads(text)["choices"][0]["text"], json.loads(text)["choices"][0]["finish_reason"]
        assert (got, finish) == (full[:cut], "stop")


@pytest.mark.parametrize("path,body,status,words", [
    ("/v1/completions", {"prompt": "x", "max_tokens": 500}, 400, ["max_tokens", "[1, "]),
    ("/v1/completions", {"prompt": "x", "n": 2}, 400, ["n: only 1"]),
    ("/v1/completions", {"prompt": "x", "temperature": -1}, 400, ["temperature", "[0.0, 2.0]"]),
    ("/v1/completions", {"prompt": "x", "model": "gpt-4"}, 404, ["'gpt-4'", "'tiny-test'"]),
    ("/v1/completions", {"prompt": [1, 99999]}, 400, ["99999", "[0, 512)"]),
    ("/v1/completions", {"prompt": "word " * 200}, 400, ["max_model_len 256"]),
    ("/v1/completions", {"max_tokens": 3}, 400, ["prompt"]),
    ("/v1/completions", {"prompt": "x", "logprobs": 2}, 400, ["logprobs"]),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, ["messages[0].role"]),
    ("/v1/chat/completions", {"messages": []}, 400, ["messages"]),
    ("/v1/embeddings", {"input": "x"}, 404, ["POST /v1/embeddings"]),
])
def test_bad_requests_name_the_field(server, path, body, status, words):
    got, ctype, text = call(server, path, body)
    assert got == status and ctype == "application/json"
    message = json.loads(text)["error"]["message"]
    assert all(w in message for w in words), message


def test_body_that_is_not_json(server):
    status, _, text = call(server, "/v1/completions", raw=b"{not json")
    assert status == 400 and "not JSON" in json.loads(text)["error"]["message"]


def test_max_model_len_above_the_model_is_refused(model):
    with pytest.raises(ValueError, match="max_position_embeddings is 4096"):
        Server(model, "127.0.0.1", 0, max_model_len=10 ** 6)


def test_cli_serve_starts_and_answers(tmp_path):
    """`dsv4 serve --preset tiny --port 0` prints its URL, answers, and stops on SIGINT."""
    import os
    import re
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "dsv4.cli", "serve", "--preset", "tiny", "--device", "cpu",
                             "--port", "0", "--served-model-name", "cli-tiny"],
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stderr.readline()
        url = re.search(r"at (http://\S+/v1)", line)
        assert url, line
        with urllib.request.urlopen(url.group(1) + "/models", timeout=30) as r:
            assert json.loads(r.read())["data"][0]["id"] == "cli-tiny"
        req = urllib.request.Request(url.group(1) + "/completions", data=json.dumps(
            {"prompt": "hi", "max_tokens": 3, "seed": 1}).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            assert json.loads(r.read())["usage"]["completion_tokens"] >= 1
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
