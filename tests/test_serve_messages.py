"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) through Anthropic's own client (tiny,
CPU): a message is the chat path's reply to the same conversation (the same tokens for the same seed), as content
blocks (thinking, text, tool_use), whole or as the Messages stream's events; the conversation's blocks (tool_use,
tool_result, thinking) become the chat conversation; errors are Anthropic-shaped and name the Messages field."""

from __future__ import annotations

import json

import pytest
import torch

import dsv4
import serving
from dsv4.serve import Server, messages_api
from dsv4.serve.protocol import RequestError

anthropic = pytest.importorskip("anthropic")

NAME = "tiny-messages"
KEY = "secret"
FLAG = {"name": "flag", "description": "set the flag", "strict": True,
        "input_schema": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"],
                         "additionalProperties": False}}
CHAT_FLAG = {"type": "function", "function": {"name": "flag", "description": "set the flag", "strict": True,
                                              "parameters": FLAG["input_schema"]}}


@pytest.fixture(scope="module")
def model():
    return dsv4.load("tiny", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def server(model):
    with Server(model, "127.0.0.1", 0, model_name=NAME, max_model_len=2048, max_num_seqs=4, api_key=KEY) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=serving.root(server), api_key=KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def openai_client(server):
    return serving.client(server, timeout=300, api_key=KEY)


def test_a_message_is_the_chat_reply(client, openai_client):
    r = client.messages.create(model=NAME, max_tokens=12, system="be brief",
                               messages=[{"role": "user", "content": "hello"}], extra_body={"seed": 7})
    c = openai_client.chat.completions.create(model=NAME, max_completion_tokens=12, seed=7, messages=[
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}])
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_") and r.model == NAME
    assert [b.type for b in r.content] == ["text"] and r.content[0].text == c.choices[0].message.content
    assert (r.stop_reason, r.stop_sequence) == ("max_tokens", None)
    assert (r.usage.input_tokens, r.usage.output_tokens) == (c.usage.prompt_tokens, 12)


def test_the_stream_is_the_whole_message_in_events(client):
    kw = dict(model=NAME, max_tokens=10, messages=[{"role": "user", "content": "hi"}], extra_body={"seed": 3})
    whole = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events if e.type not in ("text",)]  # "text": the client's own convenience event
    assert kinds[0] == "message_start" and kinds[1] == "content_block_start" and kinds[-3:] == [
        "content_block_stop", "message_delta", "message_stop"]
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason == "max_tokens" and final.usage.output_tokens == 10


def test_thinking_comes_first_as_a_thinking_block(client, openai_client):
    r = client.messages.create(model=NAME, max_tokens=10, messages=[{"role": "user", "content": "why?"}],
                               thinking={"type": "enabled", "budget_tokens": 1024}, extra_body={"seed": 4})
    c = openai_client.chat.completions.create(model=NAME, max_completion_tokens=10, seed=4, messages=[
        {"role": "user", "content": "why?"}], extra_body={"thinking": {"type": "enabled"}})
    # random weights never close </think>: the reply is its thinking
    assert [b.type for b in r.content] == ["thinking"] and r.content[0].signature == ""
    assert r.content[0].thinking == c.choices[0].message.model_extra["reasoning_content"]
    with client.messages.stream(model=NAME, max_tokens=10, messages=[{"role": "user", "content": "why?"}],
                                thinking={"type": "enabled", "budget_tokens": 1024}, extra_body={"seed": 4}) as s:
        final = s.get_final_message()
    assert final.content[0].thinking == r.content[0].thinking


def test_a_forced_tool_and_its_result_back(client, openai_client):
    first = client.messages.create(model=NAME, max_tokens=300, messages=[{"role": "user", "content": "flag it"}],
                                   tools=[FLAG], tool_choice={"type": "tool", "name": "flag"}, extra_body={"seed": 1})
    [use] = first.content
    assert first.stop_reason == "tool_use" and use.type == "tool_use" and use.name == "flag"
    assert set(use.input) == {"on"} and isinstance(use.input["on"], bool)
    with client.messages.stream(model=NAME, max_tokens=300, messages=[{"role": "user", "content": "flag it"}],
                                tools=[FLAG], tool_choice={"type": "tool", "name": "flag"},
                                extra_body={"seed": 1}) as s:
        streamed = s.get_final_message()
    assert streamed.content[0].input == use.input and streamed.stop_reason == "tool_use"
    # the next turn: thinking and tool_use back, the tool_result and a text: the chat conversation's prompt
    turn = [{"role": "user", "content": "flag it"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "set it", "signature": ""},
                                              {"type": "tool_use", "id": use.id, "name": "flag", "input": use.input}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "done"},
                                         {"type": "text", "text": "and now?"}]}]
    counted = client.messages.count_tokens(model=NAME, messages=turn, tools=[FLAG])
    chat = [{"role": "user", "content": "flag it"},
            {"role": "assistant", "content": None, "reasoning_content": "set it", "tool_calls": [
                {"id": use.id, "type": "function", "function": {"name": "flag", "arguments": json.dumps(use.input)}}]},
            {"role": "tool", "tool_call_id": use.id, "content": "done"}, {"role": "user", "content": "and now?"}]
    c = openai_client.chat.completions.create(model=NAME, messages=chat, tools=[CHAT_FLAG], max_completion_tokens=6,
                                              seed=2)
    assert counted.input_tokens == c.usage.prompt_tokens
    second = client.messages.create(model=NAME, max_tokens=6, messages=turn, tools=[FLAG], extra_body={"seed": 2})
    assert "".join(b.text for b in second.content if b.type == "text") == (c.choices[0].message.content or "")


def test_a_stop_sequence_is_named(client):
    stops = ["e", "a", "o", "t"]
    r = client.messages.create(model=NAME, max_tokens=64, messages=[{"role": "user", "content": "go"}],
                               stop_sequences=stops, extra_body={"seed": 5})
    text = "".join(b.text for b in r.content if b.type == "text")
    assert r.stop_reason == "stop_sequence" and r.stop_sequence in stops
    assert not any(s in text for s in stops)


def test_the_api_key_is_read_from_x_api_key(server):
    wrong = anthropic.Anthropic(base_url=serving.root(server), api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        wrong.messages.create(model=NAME, max_tokens=2, messages=[{"role": "user", "content": "x"}])
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "authentication_error"


@pytest.mark.parametrize("body,words", [
    ({"max_tokens": 5000}, "max_tokens: an integer in"),
    ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences: "),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "zz", "content": "x"}]}]},
     "messages[0].content[0].tool_use_id: 'zz'"),
    ({"tools": [FLAG], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name: 'nope'"),
    ({"output_config": {"effort": "low"}}, "output_config.effort: "),
])
def test_chat_errors_name_the_messages_field(client, body, words):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(**{"model": NAME, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
                                  **body})
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    assert e.value.body["error"]["message"].startswith(words), e.value.body


def test_blocks_become_the_conversation():
    chat, sources = messages_api.to_chat({
        "model": "m", "max_tokens": 5, "system": [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
                                                  {"type": "text", "text": "b"}],
        "messages": [{"role": "user", "content": "q"},
                     {"role": "assistant", "content": [{"type": "text", "text": "let me"},
                                                       {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}},
                                                       {"type": "tool_use", "id": "t2", "name": "g", "input": {}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "one"},
                                                  {"type": "tool_result", "tool_use_id": "t2", "is_error": True,
                                                   "content": [{"type": "text", "text": "failed"}]}]}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True}, "tools": [FLAG],
        "output_config": {"effort": "max", "format": {"type": "json_schema", "schema": {"type": "object"}}},
        "metadata": {"user_id": "u"}, "stop_sequences": ["END"]})
    assert chat["messages"] == [
        {"role": "system", "content": "a\n\nb"}, {"role": "user", "content": "q"},
        {"role": "assistant", "content": "let me", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}},
            {"id": "t2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "one"},
        {"role": "tool", "tool_call_id": "t2", "content": "failed"}]
    assert sources == ["system", "messages[0]", "messages[1]", "messages[2].content[0]", "messages[2].content[1]"]
    assert (chat["tool_choice"], chat["parallel_tool_calls"], chat["reasoning_effort"]) == ("required", False, "max")
    assert chat["response_format"]["json_schema"]["schema"] == {"type": "object"}
    assert (chat["user"], chat["stop"], chat["max_completion_tokens"]) == ("u", ["END"], 5)
    assert chat["tools"] == [CHAT_FLAG]


@pytest.mark.parametrize("body,param", [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]}]},
     "messages[0].content[0]"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
    ({"thinking": {"type": "adaptive"}}, "thinking"),
    ({"thinking": {"type": "enabled", "budget_tokens": 2000, "display": "omitted"}}, "thinking.display"),
    ({"container": "c1"}, "container"),
    ({"cache_control": {"type": "ephemeral"}}, "cache_control"),
    ({"output_config": {"format": {"type": "xml"}}}, "output_config.format"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({"service_tier": "priority"}, "service_tier"),
    ({"frobnicate": 1}, "frobnicate"),
])
def test_refusals_name_the_messages_field(body, param):
    with pytest.raises(RequestError) as e:
        messages_api.to_chat({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **body})
    assert e.value.param == param and e.value.message.startswith(param), e.value.message


def test_max_tokens_is_required():
    with pytest.raises(RequestError) as e:
        messages_api.to_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert e.value.param == "max_tokens"


def test_every_messages_field_is_honoured_or_refused():
    """Each field of Anthropic's client's Messages request is served or refused unless null: a client version that
    adds one fails here until it is decided."""
    import typing

    from anthropic.types import message_create_params

    fields = set(typing.get_type_hints(message_create_params.MessageCreateParamsBase))
    decided = set(messages_api.PASSED) | set(messages_api.CONVERTED) | set(messages_api._REFUSED)
    assert not fields - decided, f"decide for {sorted(fields - decided)}: implement or refuse"
