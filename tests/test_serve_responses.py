"""OpenAI's Responses API (POST /v1/responses) through the openai client (tiny, CPU): a response is the chat path's
reply to the same conversation (the same tokens for the same seed), as output items (reasoning, message,
function_call), whole or as typed stream events; input items (messages, function calls and their outputs, reasoning)
become the chat conversation; what dsv4 does not implement is a 400 naming the Responses field."""

from __future__ import annotations

import json

import openai
import pytest
import torch

import dsv4
import serving
from dsv4.serve import Server, responses
from dsv4.serve.protocol import RequestError

NAME = "tiny-responses"
FLAG = {"type": "function", "name": "flag", "description": "set the flag", "strict": True,
        "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"],
                       "additionalProperties": False}}
CHAT_FLAG = {"type": "function", "function": {k: v for k, v in FLAG.items() if k != "type"}}


@pytest.fixture(scope="module")
def model():
    return dsv4.load("tiny", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def client(model):
    with Server(model, "127.0.0.1", 0, model_name=NAME, max_model_len=2048, max_num_seqs=4) as srv:
        yield serving.client(srv, timeout=300)


def chat(client, messages, **kw):
    return client.chat.completions.create(model=NAME, messages=messages, **kw).choices[0]


def test_a_text_input_is_the_chat_reply(client):
    r = client.responses.create(model=NAME, input="hello", instructions="be brief", max_output_tokens=12,
                                extra_body={"seed": 7})
    c = chat(client, [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}],
             max_completion_tokens=12, seed=7)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == NAME
    assert r.output_text == c.message.content
    assert (r.status, r.incomplete_details.reason) == ("incomplete", "max_output_tokens")  # cut at 12 tokens
    assert [o.type for o in r.output] == ["message"] and r.output[0].role == "assistant"
    assert (r.usage.output_tokens, r.usage.output_tokens_details.reasoning_tokens) == (12, 0)
    assert r.instructions == "be brief" and r.max_output_tokens == 12 and r.store is False


def test_the_stream_is_the_whole_response_in_events(client):
    kw = dict(model=NAME, input=[{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
              max_output_tokens=10, extra_body={"seed": 3})
    whole = client.responses.create(**kw)
    events = list(client.responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert text == whole.output_text == final.output_text and final.status == whole.status
    assert final.usage.output_tokens == whole.usage.output_tokens == 10
    assert events[0].response.status == "in_progress" and events[0].response.output == []


def test_reasoning_effort_high_is_the_thinking_mode(client):
    r = client.responses.create(model=NAME, input="why?", reasoning={"effort": "high"}, max_output_tokens=10,
                                extra_body={"seed": 4})
    c = chat(client, [{"role": "user", "content": "why?"}], max_completion_tokens=10, seed=4,
             extra_body={"thinking": {"type": "enabled"}})
    reasoning = c.message.model_extra["reasoning_content"]
    # random weights never close </think>: the whole reply is reasoning, every token of it counted as such
    assert [o.type for o in r.output] == ["reasoning"] and r.output[0].content[0].text == reasoning
    assert r.usage.output_tokens_details.reasoning_tokens == r.usage.output_tokens == 10
    events = list(client.responses.create(model=NAME, input="why?", reasoning={"effort": "high"},
                                          max_output_tokens=10, stream=True, extra_body={"seed": 4}))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == reasoning
    off = client.responses.create(model=NAME, input="why?", reasoning={"effort": "none"}, max_output_tokens=10,
                                  extra_body={"seed": 4})
    assert [o.type for o in off.output] == ["message"]


def test_a_forced_call_and_its_output_back(client):
    first = client.responses.create(model=NAME, input="flag it", tools=[FLAG], max_output_tokens=300,
                                    tool_choice={"type": "function", "name": "flag"}, extra_body={"seed": 1})
    [call] = first.output
    assert first.status == "completed" and call.type == "function_call" and call.name == "flag"
    assert set(json.loads(call.arguments)) == {"on"} and call.call_id
    events = list(client.responses.create(model=NAME, input="flag it", tools=[FLAG], max_output_tokens=300,
                                          tool_choice={"type": "function", "name": "flag"}, stream=True,
                                          extra_body={"seed": 1}))
    assert [e.arguments for e in events if e.type == "response.function_call_arguments.done"] == [call.arguments]
    assert events[-1].type == "response.completed"
    # the next turn: the call and its output as input items, the chat conversation's reply
    items = [{"role": "user", "content": "flag it"}, {"type": "function_call", "call_id": call.call_id,
                                                      "name": "flag", "arguments": call.arguments},
             {"type": "function_call_output", "call_id": call.call_id, "output": "done"}]
    second = client.responses.create(model=NAME, input=items, tools=[FLAG], max_output_tokens=8,
                                     extra_body={"seed": 2})
    messages = [{"role": "user", "content": "flag it"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": call.call_id, "type": "function", "function": {"name": "flag", "arguments": call.arguments}}]},
                {"role": "tool", "tool_call_id": call.call_id, "content": "done"}]
    c = client.chat.completions.create(model=NAME, messages=messages, tools=[CHAT_FLAG], max_completion_tokens=8,
                                       seed=2)
    assert second.usage.input_tokens == c.usage.prompt_tokens
    assert second.output_text == (c.choices[0].message.content or "")


def test_input_items_become_the_conversation():
    chat_body, echo = responses.to_chat({"model": "m", "instructions": "sys", "input": [
        {"role": "user", "content": "q"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
        {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "let me", "annotations": [], "logprobs": []}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"a\": 1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]},
        {"role": "developer", "content": "dev"}],
        "max_output_tokens": 5, "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}},
        "tool_choice": {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "f"}]}})
    assert chat_body["messages"] == [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "q"},
        {"role": "assistant", "content": "let me", "reasoning_content": "think", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{\"a\": 1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "one"}, {"role": "tool", "tool_call_id": "c2", "content": "two"},
        {"role": "developer", "content": "dev"}]
    assert echo.sources == ["instructions", "input[0]", "input[2]", "input[5]", "input[6]", "input[7]"]
    assert chat_body["max_completion_tokens"] == 5
    assert chat_body["response_format"] == {"type": "json_schema", "json_schema": {"name": "n",
                                                                                   "schema": {"type": "object"}}}
    assert chat_body["tool_choice"] == {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": "f"}}]}}
    assert echo.param("messages[3].tool_call_id") == "input[5].call_id"
    assert echo.param("tools[2].function.parameters") == "tools[2].parameters"


@pytest.mark.parametrize("body,param,words", [
    ({"store": True}, "store", "stores no responses"),
    ({"previous_response_id": "resp_1"}, "previous_response_id", "stateless"),
    ({"include": ["reasoning.encrypted_content"]}, "include", "only []"),
    ({"top_logprobs": 3}, "top_logprobs", "only 0"),
    ({"truncation": "auto"}, "truncation", "never cut"),
    ({"reasoning": {"effort": "medium"}}, "reasoning.effort", "'none'"),
    ({"reasoning": {"summary": "auto"}}, "reasoning.summary", "not a summary"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]", "function tools only"),
    ({"text": {"format": {"type": "text"}, "verbosity": "low"}}, "text.verbosity", "null only"),
    ({"stream_options": {"include_obfuscation": False}}, "stream_options", "only with stream"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]",
     "text only"),
    ({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}, {"role": "assistant",
                                                                                    "content": "a"}]},
     "input[0].encrypted_content", "encrypted"),
    ({"input": [{"role": "user", "content": "q"}, {"type": "reasoning", "summary": []}]}, "input[1]", "none follows"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0]", "'function_call_output'"),
    ({"input": []}, "input", "non-empty"),
    ({"frobnicate": 1}, "frobnicate", "not a field"),
])
def test_refusals_name_the_responses_field(body, param, words):
    with pytest.raises(RequestError) as e:
        responses.to_chat({"model": "m", "input": "hi", **body})
    assert e.value.param == param and e.value.message.startswith(param) and words in e.value.message, e.value.message


@pytest.mark.parametrize("body,param", [
    ({"max_output_tokens": 10**9}, "max_output_tokens"),
    ({"input": [{"type": "function_call_output", "call_id": "zz", "output": "x"}]}, "input[0].call_id"),
    ({"tools": [FLAG], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
    ({"tools": [{**FLAG, "parameters": {"type": "no-such-type"}}]}, "tools[0].parameters"),
    ({"text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "no-such-type"}}}},
     "text.format.schema"),
    ({"temperature": 5}, "temperature"),
])
def test_chat_errors_name_the_responses_field_over_http(client, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(**{"model": NAME, "input": "hi", "max_output_tokens": 4, **body})
    assert e.value.body["param"] == param and e.value.body["message"].startswith(param), e.value.body


def test_every_responses_field_is_honoured_or_refused():
    """Each field of the openai client's Responses request is served (taken as the chat request takes it, or
    converted) or refused unless neutral: a client version that adds one fails here until it is decided."""
    import typing

    from openai.types.responses import response_create_params

    fields = set(typing.get_type_hints(response_create_params.ResponseCreateParamsBase))
    decided = set(responses.PASSED) | set(responses.CONVERTED) | set(responses._NEUTRAL)
    assert not fields - decided, f"decide for {sorted(fields - decided)}: implement or refuse"
    for name in sorted(set(responses._NEUTRAL) & fields):
        with pytest.raises(RequestError) as e:
            responses.to_chat({"model": "m", "input": "hi", name: "something"})
        assert e.value.param == name
