"""Malformed requests are 400s, never a server error: every field of a full request (OpenAI's chat with this
session's fields, completions with structured_outputs and prompt_logprobs, the Responses API, Anthropic's Messages
API) replaced in turn by values of the wrong shape, through the converters and protocol.parse. Each must raise
RequestError (a 400 naming a field) or be served; any other exception would be a 500. (The first run of this walk
found three: a reasoning item's content of the wrong type, and an unhashable tool_choice type in two places.)"""

from __future__ import annotations

import copy

import pytest
import torch

import dsv4
from dsv4.serve import messages_api, protocol, responses
from dsv4.serve.protocol import RequestError

pytest.importorskip("xgrammar")

JUNK = [None, 0, 1, -1, 2.5, "", "x", [], {}, [1], {"a": 1}, True, False, [{}], [None], {"type": None}, "auto",
        {"type": "function"}, [[1]]]
RESPONSES = {"model": "m", "input": [
    {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c", "output": "o"},
    {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "r"}]},
    {"role": "assistant", "content": "a"}],
    "instructions": "s", "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
    "tool_choice": {"type": "function", "name": "f"}, "reasoning": {"effort": "high"}, "max_output_tokens": 5,
    "text": {"format": {"type": "text"}}}
MESSAGES = {"model": "m", "max_tokens": 5, "system": [{"type": "text", "text": "s"}], "messages": [
    {"role": "user", "content": [{"type": "text", "text": "q"}]},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": ""},
                                      {"type": "tool_use", "id": "i", "name": "f", "input": {}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "i", "content": [{"type": "text",
                                                                                          "text": "r"}]}]}],
    "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "tool", "name": "f"},
    "thinking": {"type": "enabled", "budget_tokens": 1024}, "metadata": {"user_id": "u"}, "stop_sequences": ["x"],
    "output_config": {"effort": "max"}}
FORMATS = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "q"}],
           "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "reasoning_effort": "high",
        "parallel_tool_calls": False, "tools": [{"type": "function", "function": {
            "name": "f", "strict": True, "parameters": {"type": "object", "properties": {"a": {"type": "boolean"}}}}}],
        "tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
            {"type": "function", "function": {"name": "f"}}]}}}
COMPLETIONS = {"prompt": "x", "structured_outputs": {"choice": ["a", "b"]}, "prompt_logprobs": 2, "max_tokens": 2}


def paths(o, at=()):
    yield at
    if isinstance(o, dict):
        for k, v in o.items():
            yield from paths(v, at + (k,))
    elif isinstance(o, list):
        for i, v in enumerate(o):
            yield from paths(v, at + (i,))


def replaced(o, at, v):
    if not at:
        return v
    o = copy.deepcopy(o)
    cur = o
    for k in at[:-1]:
        cur = cur[k]
    cur[at[-1]] = v
    return o


@pytest.fixture(scope="module")
def model():
    return dsv4.load("tiny", device="cpu", dtype=torch.float32)


@pytest.mark.parametrize("api", ["responses", "messages", "messages-format", "chat", "completions"])
def test_every_field_of_the_wrong_shape_is_a_400(model, api):
    base, parse = {
        "responses": (RESPONSES, lambda b: protocol.parse(responses.to_chat(b)[0], model, 4096, True, 8)),
        "messages": (MESSAGES, lambda b: protocol.parse(messages_api.to_chat(b)[0], model, 4096, True, 8)),
        "messages-format": (FORMATS, lambda b: protocol.parse(messages_api.to_chat(b)[0], model, 4096, True, 8)),
        "chat": (CHAT, lambda b: protocol.parse(b, model, 4096, True, 8)),
        "completions": (COMPLETIONS, lambda b: protocol.parse(b, model, 4096, False, 8)),
    }[api]
    parse(base)  # the full request is served
    crashes = []
    for at in paths(base):
        for v in JUNK:
            try:
                parse(replaced(base, at, v))
            except RequestError:
                pass
            except Exception as e:  # noqa: BLE001 - what the walk is for: anything but a RequestError
                crashes.append((at, v, f"{type(e).__name__}: {e}"[:120]))
    assert not crashes, crashes[:5]
