"""Tool calls held by a grammar: tool_choice 'required', a named function and allowed_tools, tools with strict: true,
parallel_tool_calls false; and a JSON response_format after a thinking reply's reasoning (tiny, CPU).

The grammar is xgrammar's deepseek_v4 structural tag over the DSML block dsv4's encoder writes and its parser reads
(dsv4.serve.grammar.compile_tool_calls). The grammar cases feed whole replies, token by token, to a matcher of the
request's compiled grammar: what it must take and what it must refuse. The server cases ask the openai client for
forced calls of random weights and read them back as tool_calls whose arguments follow the schema."""

from __future__ import annotations

import json
import types

import openai
import pytest
import torch

import dsv4
import serving
from dsv4.serve import Server, chat, protocol

xgr = pytest.importorskip("xgrammar")

NAME = "tiny-tools"
MAX_MODEL_LEN = 2048  # DeepSeek-V4's tools section is ~900 of the stand-in tokenizer's tokens
USER = [{"role": "user", "content": "weather?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "today's weather", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "hot": {"type": "boolean"}},
                   "required": ["city", "hot"], "additionalProperties": False}}}
NOTE = {"type": "function", "function": {  # not strict: any arguments
    "name": "note", "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}}
FLAG = {"type": "function", "function": {
    "name": "flag", "strict": True,
    "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"],
                   "additionalProperties": False}}}


def invoke(name: str, **params) -> str:
    body = "\n".join(f'<｜DSML｜parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
                     f'{v if isinstance(v, str) else json.dumps(v)}</｜DSML｜parameter>' for k, v in params.items())
    return f'<｜DSML｜invoke name="{name}">\n{body}\n</｜DSML｜invoke>'


def block(*invokes: str) -> str:
    """Tool calls as DeepSeek-V4's encoder writes them after a turn's content (chat.encode_tool_calls)."""
    return "\n\n<｜DSML｜tool_calls>\n" + "\n".join(invokes) + "\n</｜DSML｜tool_calls>"


PARIS = invoke("get_weather", city="Paris", hot=True)


@pytest.fixture(scope="module")
def model():
    return dsv4.load("tiny", device="cpu", dtype=torch.float32)


def grammar(model, **body):
    call = protocol.parse({"messages": USER, **body}, model, MAX_MODEL_LEN, True, 8)
    assert call.grammar is not None
    return call


def takes(model, call, text: str) -> bool:
    """Whether the reply `text` then EOS is a whole sentence of the call's grammar."""
    matcher = xgr.GrammarMatcher(call.grammar)
    ids = model.tokenizer.encode(text, add_bos=False) + [model.cfg.eos_token_id]
    return all(matcher.accept_token(t) for t in ids) and matcher.is_terminated()


def parsed(call, text: str) -> tuple[str, str, list]:
    """(reasoning, content, [(name, arguments as a dict)]) of a reply as the server reads it."""
    reply = chat.ChatReply(call.reply)
    reply.push(text)
    reply.end()
    m = reply.message()
    return (m.get("reasoning_content") or "", m["content"] or "",
            [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in m.get("tool_calls", [])])


def test_required_takes_calls_and_refuses_text(model):
    call = grammar(model, tools=[WEATHER, NOTE], tool_choice="required")
    assert takes(model, call, block(PARIS))
    assert takes(model, call, block(PARIS, invoke("note", anything="goes", n=3)))  # note is not strict
    assert not takes(model, call, "Sunny in Paris.")
    assert not takes(model, call, "")
    assert not takes(model, call, block(invoke("get_time", zone="UTC")))  # not a tool
    assert parsed(call, block(PARIS)) == ("", "", [("get_weather", {"city": "Paris", "hot": True})])


@pytest.mark.parametrize("args", [dict(city="London", hot=True), dict(city="Paris"), dict(hot=True, city="Paris"),
                                  dict(city="Paris", hot=True, wind=3), dict(city="Paris", hot="yes")],
                         ids=["enum", "missing", "order", "extra", "type"])
def test_strict_arguments_follow_the_schema(model, args):
    call = grammar(model, tools=[WEATHER], tool_choice="required")
    assert not takes(model, call, block(invoke("get_weather", **args)))


def test_named_function_is_one_call_of_it(model):
    call = grammar(model, tools=[WEATHER, FLAG], tool_choice={"type": "function", "function": {"name": "flag"}})
    assert call.grammar is not None and takes(model, call, block(invoke("flag", on=False)))
    assert not takes(model, call, block(PARIS))
    assert not takes(model, call, block(invoke("flag", on=False), invoke("flag", on=True)))
    assert parsed(call, block(invoke("flag", on=False)))[2] == [("flag", {"on": False})]


def test_parallel_tool_calls_false_is_at_most_one_call(model):
    call = grammar(model, tools=[WEATHER, FLAG], tool_choice="required", parallel_tool_calls=False)
    assert takes(model, call, block(invoke("flag", on=True)))
    assert not takes(model, call, block(PARIS, invoke("flag", on=True)))
    auto = grammar(model, tools=[WEATHER, NOTE], parallel_tool_calls=False)  # auto: text, or text and one call
    assert takes(model, auto, "Let me check.") and takes(model, auto, "Let me check." + block(PARIS))
    assert not takes(model, auto, "Let me check." + block(PARIS, PARIS))


def test_allowed_tools_limit_the_calls(model):
    allowed = {"type": "allowed_tools", "allowed_tools": {
        "mode": "required", "tools": [{"type": "function", "function": {"name": "flag"}}]}}
    call = grammar(model, tools=[WEATHER, FLAG], tool_choice=allowed)
    assert takes(model, call, block(invoke("flag", on=True), invoke("flag", on=False)))
    assert not takes(model, call, block(PARIS)) and not takes(model, call, "no call")
    allowed["allowed_tools"]["mode"] = "auto"
    auto = grammar(model, tools=[WEATHER, FLAG], tool_choice=allowed)
    assert takes(model, auto, "no call") and takes(model, auto, "ok" + block(invoke("flag", on=True)))
    assert not takes(model, auto, "ok" + block(PARIS))
    # every tool stays in the prompt (OpenAI's allowed_tools): the same prompt as tool_choice auto
    plain = protocol.parse({"messages": USER, "tools": [WEATHER, FLAG]}, model, MAX_MODEL_LEN, True, 8)
    assert auto.prompts[0].ids == plain.prompts[0].ids


def test_a_strict_tool_under_auto_holds_its_arguments_only(model):
    call = grammar(model, tools=[WEATHER, NOTE])  # asked for by WEATHER's strict
    assert takes(model, call, "Sunny.") and takes(model, call, "Checking." + block(PARIS))
    assert takes(model, call, block(invoke("note", whatever="x")))
    assert not takes(model, call, "Checking." + block(invoke("get_weather", city="Oslo", hot=False)))
    assert protocol.parse({"messages": USER, "tools": [NOTE]}, model, MAX_MODEL_LEN, True, 8).grammar is None


def test_thinking_reasons_freely_then_calls(model):
    call = grammar(model, tools=[WEATHER], tool_choice="required", chat_template_kwargs={"thinking": True})
    assert call.reply.reasoning
    text = "The user wants Paris." + "</think>" + block(PARIS)
    assert takes(model, call, text)
    assert not takes(model, call, block(PARIS))  # still reasoning: no </think>, no call
    assert not takes(model, call, "hmm</think>Sunny.")
    assert parsed(call, text) == ("The user wants Paris.", "", [("get_weather", {"city": "Paris", "hot": True})])


def test_json_response_format_comes_after_the_reasoning(model):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    call = grammar(model, response_format=fmt, chat_template_kwargs={"thinking": True})
    # the same JSON as without reasoning: xgrammar's compact form (", " and ": " separators, no other whitespace)
    assert takes(model, call, 'Easy.</think>{"ok": true}')
    assert not takes(model, call, 'Easy.</think>{"ok":  true}') and not takes(model, call, 'Easy.</think>{"ok":true}')
    assert not takes(model, call, '{"ok": true}')  # inside the reasoning
    assert parsed(call, 'Easy.</think>{"ok": true}')[:2] == ("Easy.", '{"ok": true}')
    plain = grammar(model, response_format=fmt)  # chat mode: the JSON from the first token
    assert takes(model, plain, '{"ok": true}') and not takes(model, plain, 'Easy.</think>{"ok": true}')


@pytest.mark.parametrize("body,param,words", [
    ({"tool_choice": "required"}, "tool_choice", "only with tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "flag"}}},
     "tool_choice.function.name", "'flag' is not one of the tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice", "function: Field required"),
    ({"tools": [WEATHER], "tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": "nope"}}]}}}, "tool_choice.allowed_tools.tools[0].function.name",
     "'nope'"),
    ({"tools": [WEATHER], "tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "none", "tools": []}}},
     "tool_choice", "allowed_tools.mode"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "listed twice"),
    ({"tools": [NOTE, {"type": "function", "function": {"name": "bad", "strict": True,
                                                      "parameters": {"type": "no-such-type"}}}]},
     "tools[1].function.parameters", "not a JSON schema"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format",
     "not with tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "no"}, "parallel_tool_calls", "true or false"),
])
def test_refusals_name_the_field(model, body, param, words):
    with pytest.raises(protocol.RequestError) as e:
        protocol.parse({"messages": USER, **body}, model, MAX_MODEL_LEN, True, 8)
    assert e.value.param == param and words in e.value.message, e.value.message


@pytest.mark.parametrize("body,param", [
    ({"tools": [NOTE], "tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER]}, "tools[0].function.strict"),
    ({"tools": [NOTE], "parallel_tool_calls": False}, "parallel_tool_calls"),
])
def test_tool_grammars_refused_on_cuda_unless_unchecked(model, monkeypatch, body, param):
    """The grammar's device-side mask has not run on a GPU (benchmarks/sampling_check.py carries it now)."""
    cuda = types.SimpleNamespace(cfg=model.cfg, tokenizer=model.tokenizer, device=torch.device("cuda"))
    monkeypatch.delenv("DSV4_UNCHECKED_SAMPLING", raising=False)
    with pytest.raises(protocol.RequestError) as e:
        protocol.parse({"messages": USER, **body}, cuda, MAX_MODEL_LEN, True, 8)
    assert e.value.param == param and "not yet available on CUDA" in e.value.message
    plain = {"messages": USER, "tools": [NOTE], "parallel_tool_calls": True}
    assert protocol.parse(plain, cuda, MAX_MODEL_LEN, True, 8).grammar is None  # free calls, as before
    monkeypatch.setenv("DSV4_UNCHECKED_SAMPLING", "1")
    assert protocol.parse({"messages": USER, **body}, cuda, MAX_MODEL_LEN, True, 8).grammar is not None


# ---- over HTTP: random weights made to call ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def client(model):
    with Server(model, "127.0.0.1", 0, model_name=NAME, max_model_len=MAX_MODEL_LEN, max_num_seqs=4) as srv:
        yield serving.client(srv, timeout=300)


def _check_weather(args: dict):
    assert set(args) == {"city", "hot"} and args["city"] in ("Paris", "Rome") and isinstance(args["hot"], bool)


@pytest.mark.parametrize("seed", [1, 2])
def test_forced_call_over_http(client, seed):
    kw = dict(model=NAME, messages=USER, tools=[WEATHER, FLAG], max_tokens=300, seed=seed,
              tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = client.chat.completions.create(**kw).choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    _check_weather(json.loads(call.function.arguments))
    streamed = [d for c in client.chat.completions.create(stream=True, **kw) for d in c.choices[0].delta.tool_calls or ()
                if c.choices]
    assert [(d.function.name, d.function.arguments) for d in streamed] == [(call.function.name,
                                                                            call.function.arguments)]


def test_required_one_call_over_http(client):
    r = client.chat.completions.create(model=NAME, messages=USER, tools=[WEATHER, FLAG], tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=300, seed=5, n=2)
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls"
        [call] = choice.message.tool_calls
        args = json.loads(call.function.arguments)
        if call.function.name == "flag":
            assert set(args) == {"on"} and isinstance(args["on"], bool)
        else:
            assert call.function.name == "get_weather"
            _check_weather(args)


def test_refusal_over_http(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=USER, tools=[WEATHER], max_tokens=4,
                                       tool_choice={"type": "function", "function": {"name": "flag"}})
    assert "tool_choice.function.name" in str(e.value)


def test_a_vocabularys_special_markup_tokens_are_the_grammars_markers(model):
    """Where </think> and the DSML markers are special tokens (as a checkpoint's vocabulary may make them), the
    grammar takes the model's own token for them, as the reply parser reads it (test_chat's special-markup case)."""
    from dsv4.serve import grammar
    from dsv4.tokenizer import Tokenizer, build_tokenizer

    hf = build_tokenizer(model.cfg.vocab_size - 8)  # room for the markers inside the model's vocabulary
    markers = ["<think>", "</think>", "<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>"]
    hf.add_special_tokens(markers)
    tok = Tokenizer(hf, model_vocab_size=model.cfg.vocab_size)
    vocab = types.SimpleNamespace(tokenizer=tok, cfg=model.cfg)
    calls = chat.tool_calls([chat.Tool.model_validate(FLAG)], "required", None)
    compiled = grammar.compile_tool_calls(calls, vocab, reasoning=True)
    ids = tok.encode("hmm</think>" + block(invoke("flag", on=True)), add_bos=False)
    assert {hf.token_to_id(m) for m in ("</think>", "<｜DSML｜tool_calls>")} <= set(ids)  # as special tokens
    matcher = xgr.GrammarMatcher(compiled)
    assert all(matcher.accept_token(t) for t in ids + [model.cfg.eos_token_id]) and matcher.is_terminated()
    bos = xgr.GrammarMatcher(compiled)  # other special tokens stay out
    assert not bos.accept_token(tok.bos_id)
