"""vLLM's text and stop extras over HTTP (tiny, CPU): stop_token_ids, min_tokens, allowed_token_ids, bad_words,
include_stop_str_in_output, skip_special_tokens, and the choices' stop_reason; each against the unconstrained stream
of the same seed (a greedy stream where the check reads its logprobs), and the refusals that name their field."""

from __future__ import annotations

import json

import pytest
import torch

import dsv4
import serving
from serving import post
from dsv4.serve import Server

NAME = "tiny-stops"
BOS = 0  # tiny's special tokens: 0 <｜begin▁of▁sentence｜>, 1 <｜end▁of▁sentence｜> (EOS)


@pytest.fixture(scope="module")
def model():
    return dsv4.load("tiny", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def server(model):
    with Server(model, "127.0.0.1", 0, model_name=NAME, max_model_len=256, max_num_seqs=8) as srv:
        yield srv


def complete(server, **body) -> dict:
    r = post(server, "/v1/completions", {"model": NAME, "prompt": "The story goes", **body})
    assert r.status_code == 200, r.text
    return r.json()


def first_new(tokens: list[int], lo: int = 1) -> int:
    """An index i >= lo whose token did not occur before it."""
    return next(i for i in range(lo, len(tokens)) if tokens[i] not in tokens[:i])


def test_a_stop_token_id_ends_the_text_after_itself(server, model):
    plain = complete(server, max_tokens=16, seed=4, return_token_ids=True)["choices"][0]
    tokens = plain["token_ids"]
    i = first_new(tokens, 3)
    got = complete(server, max_tokens=16, seed=4, return_token_ids=True, stop_token_ids=[tokens[i]])
    c = got["choices"][0]
    assert c["token_ids"] == tokens[:i + 1] and c["finish_reason"] == "stop" and c["stop_reason"] == tokens[i]
    assert c["text"] == model.tokenizer.decode(tokens[:i + 1])  # the stop token's own text kept (vLLM's)
    assert got["usage"]["completion_tokens"] == i + 1
    streamed = serving.post(server, "/v1/completions", {"model": NAME, "prompt": "The story goes", "max_tokens": 16,
                                                        "seed": 4, "stop_token_ids": [tokens[i]], "stream": True})
    events = [json.loads(line[6:]) for line in streamed.text.splitlines()
              if line.startswith("data: {")]
    assert "".join(e["choices"][0]["text"] for e in events) == c["text"]
    assert events[-1]["choices"][0]["finish_reason"] == "stop" and events[-1]["choices"][0]["stop_reason"] == tokens[i]
    assert all(e["choices"][0]["stop_reason"] is None for e in events[:-1])
    assert plain["stop_reason"] is None  # EOS (this stream's end) or the length: no stop_reason, as vLLM


def test_min_tokens_keeps_the_stop_ids_out_of_the_first_tokens(server):
    """Greedy: the plain stream's token at position 1 is a stop id; under min_tokens 4 its first 4 tokens are those
    of the stream whose logit_bias pushes the stop id down by 100 (another path to the same argmax: the next most
    likely token), and a stop id after them ends the text."""
    tokens = complete(server, max_tokens=12, temperature=0, return_token_ids=True)["choices"][0]["token_ids"]
    stop = tokens[1]
    assert stop not in tokens[:1]
    biased = complete(server, max_tokens=12, temperature=0, return_token_ids=True, logit_bias={str(stop): -100})
    got = complete(server, max_tokens=12, temperature=0, return_token_ids=True, stop_token_ids=[stop], min_tokens=4)
    c = got["choices"][0]
    assert c["token_ids"][:4] == biased["choices"][0]["token_ids"][:4] and c["token_ids"][0] == tokens[0]
    assert stop not in c["token_ids"][:4] and len(c["token_ids"]) >= 4
    assert c["finish_reason"] == ("stop" if stop in c["token_ids"] else "length")
    if stop in c["token_ids"]:
        assert c["token_ids"].index(stop) == len(c["token_ids"]) - 1 and c["stop_reason"] == stop
    without = complete(server, max_tokens=12, temperature=0, return_token_ids=True, stop_token_ids=[stop])
    assert without["choices"][0]["token_ids"] == tokens[:2]  # without min_tokens it stops at position 1


def test_min_tokens_holds_a_stop_string_back(server):
    text = complete(server, max_tokens=16, seed=8)["choices"][0]["text"]
    stop = text[2:4]
    early = complete(server, max_tokens=16, seed=8, stop=[stop])["choices"][0]
    assert early["text"] == text[:text.index(stop)] and early["stop_reason"] == stop
    held = complete(server, max_tokens=16, seed=8, stop=[stop], min_tokens=16, return_token_ids=True)["choices"][0]
    assert len(held["token_ids"]) == 16 and held["finish_reason"] == "length" and held["stop_reason"] is None


def test_include_stop_str_in_output_keeps_the_stop_string(server):
    text = complete(server, max_tokens=16, seed=6)["choices"][0]["text"]
    stop = text[5:8]
    cut = complete(server, max_tokens=16, seed=6, stop=[stop])["choices"][0]
    kept = complete(server, max_tokens=16, seed=6, stop=[stop], include_stop_str_in_output=True)["choices"][0]
    assert cut["text"] == text[:text.index(stop)] and kept["text"] == cut["text"] + stop
    assert kept["finish_reason"] == cut["finish_reason"] == "stop" and kept["stop_reason"] == stop


def test_allowed_token_ids_hold_every_draw(server):
    plain = complete(server, max_tokens=10, seed=2, n=2, return_token_ids=True)
    allowed = [7, 19, 88, 301]
    assert any(t not in allowed for c in plain["choices"] for t in c["token_ids"])  # the check can fail
    got = complete(server, max_tokens=10, seed=2, n=2, return_token_ids=True, allowed_token_ids=allowed)
    draws = [t for c in got["choices"] for t in c["token_ids"]]
    assert len(draws) == 20 and set(draws) <= set(allowed) and len(set(draws)) > 1
    chat = post(server, "/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "hi"}],
                                                 "max_tokens": 6, "seed": 1, "allowed_token_ids": allowed,
                                                 "return_token_ids": True})
    assert chat.status_code == 200 and set(chat.json()["choices"][0]["token_ids"]) <= set(allowed)


def test_bad_words_keep_their_last_token_out(server, model):
    """Greedy. A one-token word is kept out of every step: the stream is the one whose logit_bias pushes its tokens
    (with and without a leading space) down by 100. A two-token word of the stream (its tokens 1 and 2) is cut after
    its first token: the same first two tokens, then another, and the pair never follows."""
    from dsv4.serve.protocol import _bad_word_ids

    tok = model.tokenizer
    g = complete(server, max_tokens=12, temperature=0, return_token_ids=True)["choices"][0]["token_ids"]
    one = next(t for t in g[1:] if tok.encode(tok.decode([t]), add_bos=False) == [t])
    word = tok.decode([one])
    variants = _bad_word_ids([word], tok)
    assert (one,) in variants and all(len(v) == 1 for v in variants)
    bias = {str(v[0]): -100 for v in variants}
    got = complete(server, max_tokens=12, temperature=0, return_token_ids=True, bad_words=[word])["choices"][0]
    biased = complete(server, max_tokens=12, temperature=0, return_token_ids=True, logit_bias=bias)["choices"][0]
    assert got["token_ids"] == biased["token_ids"] and one not in got["token_ids"] and one in g
    pair = tok.decode(g[1:3])
    assert tuple(tok.encode(pair.lstrip(), add_bos=False)) == tuple(g[1:3]), "pick another stream"
    got = complete(server, max_tokens=12, temperature=0, return_token_ids=True, bad_words=[pair])["choices"][0]
    ids = got["token_ids"]
    assert ids[:2] == g[:2] and ids[2] != g[2]
    assert all(tuple(ids[i:i + 2]) not in _bad_word_ids([pair], tok) for i in range(len(ids) - 1))


def test_skip_special_tokens_false_spells_special_tokens(server, model):
    both = {}
    for skip in (True, False):
        c = complete(server, max_tokens=3, seed=1, allowed_token_ids=[BOS], skip_special_tokens=skip)["choices"][0]
        both[skip] = c["text"]
    assert both[True] == "" and both[False] == model.tokenizer.decode([BOS], skip_special_tokens=False) * 3


@pytest.mark.parametrize("path,extra,param,words", [
    ("/v1/completions", {"stop_token_ids": [512]}, "stop_token_ids", "outside [0, 512)"),
    ("/v1/completions", {"stop_token_ids": "7"}, "stop_token_ids", "a list of token ids"),
    ("/v1/completions", {"stop_token_ids": [True]}, "stop_token_ids", "a list of token ids"),
    ("/v1/completions", {"allowed_token_ids": []}, "allowed_token_ids", "at least one token id"),
    ("/v1/completions", {"allowed_token_ids": [-1]}, "allowed_token_ids", "a list of token ids"),
    ("/v1/completions", {"min_tokens": 9}, "min_tokens", "at most max_tokens (8)"),
    ("/v1/completions", {"min_tokens": -1}, "min_tokens", "an integer in [0,"),
    ("/v1/completions", {"include_stop_str_in_output": "yes"}, "include_stop_str_in_output", "true or false"),
    ("/v1/completions", {"spaces_between_special_tokens": False}, "spaces_between_special_tokens", "only True"),
    ("/v1/chat/completions", {"skip_special_tokens": False}, "skip_special_tokens", "only true in chat"),
    ("/v1/completions", {"bad_words": "bad"}, "bad_words", "a list of words"),
    ("/v1/completions", {"bad_words": ["ok", " "]}, "bad_words", "a list of words"),
])
def test_bad_extras_are_refused_by_name(server, path, extra, param, words):
    base = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"}
    r = post(server, path, {"model": NAME, "max_tokens": 8, **base, **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == param and words in r.json()["error"]["message"], \
        r.text


def test_the_masks_are_refused_on_cuda_until_gpu_checked(model, monkeypatch):
    """min_tokens and allowed_token_ids draw under the device-side mask a grammar uses: refused on CUDA, as the
    grammar is, until benchmarks/gpu_s51_serve_checks.sh has run it (DSV4_UNCHECKED_SAMPLING=1 serves them)."""
    from dsv4.serve import protocol

    monkeypatch.delenv("DSV4_UNCHECKED_SAMPLING", raising=False)
    monkeypatch.setattr(model, "device", torch.device("cuda"))
    for extra, name in (({"min_tokens": 2}, "min_tokens"), ({"allowed_token_ids": [3]}, "allowed_token_ids"),
                        ({"bad_words": ["x"]}, "bad_words")):
        with pytest.raises(protocol.RequestError, match=f"{name}: not yet available on CUDA"):
            protocol.parse({"prompt": "hi", "max_tokens": 4, **extra}, model, 256, chat=False, max_choices=8)
    call = protocol.parse({"prompt": "hi", "max_tokens": 4, "stop_token_ids": [3], "min_tokens": 0}, model, 256,
                          chat=False, max_choices=8)
    assert call.text.stop_ids == (3,)  # stop ids alone are host-side: served on CUDA
