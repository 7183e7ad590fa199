"""OpenAI's Responses API (POST /v1/responses) over the chat path.

A request becomes a chat request (`to_chat`): `input` items become messages (a text is one user message; message
items keep their role; `function_call` items become the tool_calls of an assistant message, `function_call_output`
items tool messages, a `reasoning` item the reasoning_content of the assistant turn after it), `instructions` the
system message first, `tools` (flat function tools) chat tools, `tool_choice` its chat form, `text.format` the
response_format, `reasoning.effort` the chat request's reasoning_effort ("none" off, "high" thinking, "max" or
"xhigh" thinking at DeepSeek-V4's maximum effort),
`max_output_tokens` max_completion_tokens. protocol.parse then validates and tokenises it as any chat request, and an
error it raises names the Responses field (`Echo.param`). The chat reply comes back as the response's output items
(`response`: a reasoning item, message items of output_text, function_call items), whole, or as the Responses
stream's typed events (`Events`: response.created ... response.completed, each with its sequence_number).

Stateless: nothing is stored, so `store: true`, `previous_response_id`, `conversation` and `background` are refused,
as is every field whose meaning dsv4 does not implement unless it holds its neutral value (`_NEUTRAL`); a field the
API does not define is refused too. An item's `id` and `status` (what a client sends back of an earlier response's
output) and an output_text part's `annotations` and `logprobs` are the earlier output's own record, not instructions,
and are read past.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from .chat import EFFORTS
from .protocol import RequestError, now

# Responses fields taken as they are by the chat request (the sampler's; vLLM's extensions included).
PASSED = ("model", "temperature", "top_p", "stream", "parallel_tool_calls", "user", "safety_identifier",
          "prompt_cache_key", "seed", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
          "logit_bias", "ignore_eos", "stop", "structured_outputs", "chat_template_kwargs")
CONVERTED = ("input", "instructions", "max_output_tokens", "tools", "tool_choice", "text", "reasoning",
             "stream_options", "metadata", "store", "service_tier", "truncation")
# Responses fields dsv4 does not implement: the values that mean "off" (None always does); any other is refused.
_NEUTRAL = {"previous_response_id": (), "conversation": (), "background": (False,), "include": ([],),
            "max_tool_calls": (), "top_logprobs": (0,), "prompt": (), "prompt_cache_retention": (),
            "prompt_cache_options": (), "context_management": (), "moderation": (), "access_programs": (),
            "background_options": (), "image": ()}
_STATEFUL = ("previous_response_id", "conversation", "background", "background_options")
_ITEM_RECORD = {"id", "status"}  # an earlier output's own record, read past


def _refuse(message: str, param: str):
    raise RequestError(f"{param}: {message}"[:400], param)


def _text(content, param: str) -> str:
    """A message's content: a string, or a list of text parts (input_text / output_text) joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        _refuse(f"a string or a list of input_text parts, got {content!r}"[:200], param)
    out = []
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text"):
            _refuse(f"a text part (input_text or output_text; dsv4 serves text only), got {part!r}"[:200], where)
        extra = set(part) - {"type", "text"} - ({"annotations", "logprobs"} if kind == "output_text" else set())
        if extra:
            _refuse(f"not a field of a {kind} part: {sorted(extra)}", where)
        if not isinstance(part.get("text"), str):
            _refuse("text: a string", where)
        out.append(part["text"])
    return "".join(out)


def _keys(item: dict, allowed: set, param: str):
    extra = set(item) - allowed - _ITEM_RECORD
    if extra:
        _refuse(f"not a field of a {item.get('type') or 'message'} item: {sorted(extra)}", param)


@dataclass
class Echo:
    """What the response repeats of its request, and how a chat field's name reads as the Responses field's."""

    request: dict
    sources: list[str] = field(default_factory=list)  # messages[k] came from sources[k] ("input[3]", "instructions")

    def param(self, chat_param: str | None) -> str | None:
        if chat_param is None:
            return None
        m = re.match(r"messages\[(\d+)\](.*)", chat_param)
        if m:
            k, rest = int(m.group(1)), m.group(2).replace(".tool_call_id", ".call_id")
            return (self.sources[k] if k < len(self.sources) else "input") + rest
        for chat, ours in (("max_completion_tokens", "max_output_tokens"),
                           ("response_format.json_schema", "text.format"), ("response_format", "text.format"),
                           ("tool_choice.function.", "tool_choice."), ("tool_choice.allowed_tools.", "tool_choice."),
                           ("thinking", "reasoning"), ("reasoning_effort", "reasoning.effort")):
            if chat_param.startswith(chat):
                return ours + chat_param[len(chat):]
        m = re.match(r"(tools\[\d+\]|tool_choice\.tools\[\d+\])\.function(.*)", chat_param)
        return m.group(1) + m.group(2) if m else chat_param


def to_chat(body) -> tuple[dict, Echo]:
    """The chat request of a Responses request, and what its response echoes. Raises RequestError naming the field."""
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - set(PASSED) - set(CONVERTED) - set(_NEUTRAL))
    if unknown:
        _refuse("not a field of this endpoint (dsv4 serve refuses what it would otherwise ignore)", unknown[0])
    for name, allowed in _NEUTRAL.items():
        v = body.get(name)
        if v is not None and v not in allowed:
            why = " (stateless: nothing is stored)" if name in _STATEFUL else ""
            _refuse(f"only {' or '.join(repr(a) for a in allowed) or 'null'} is supported by dsv4 serve{why}, got "
                    f"{v!r}"[:300], name)
    if body.get("store") not in (None, False):
        _refuse("false or absent: dsv4 serve stores no responses (retrieval and previous_response_id are not "
                f"served), got {body['store']!r}", "store")
    if body.get("service_tier") not in (None, "auto", "default"):
        _refuse(f"'auto' or 'default', got {body['service_tier']!r}", "service_tier")
    if body.get("truncation") not in (None, "disabled"):
        _refuse(f"'disabled' (a prompt over max_model_len is refused, never cut), got {body['truncation']!r}",
                "truncation")
    metadata = body.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        _refuse(f"an object of strings, got {metadata!r}"[:200], "metadata")
    chat = {k: body[k] for k in PASSED if k in body}
    echo = Echo(body)
    chat["messages"] = _messages(body, echo)
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    if body.get("text") is not None:
        fmt = _text_format(body["text"])
        if fmt is not None:
            chat["response_format"] = fmt
    if body.get("reasoning") is not None:
        effort = _reasoning(body["reasoning"])
        if effort is not None:
            chat["reasoning_effort"] = effort
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict) or set(options) - {"include_obfuscation"}:
            _refuse(f"an object of include_obfuscation only, got {options!r}"[:200], "stream_options")
        if not body.get("stream"):
            _refuse("only with stream: true", "stream_options")
    return chat, echo


def _messages(body: dict, echo: Echo) -> list[dict]:
    items = body.get("input")
    if items is None:
        _refuse("required: a string, or a list of items", "input")
    out: list[dict] = []
    if body.get("instructions") is not None:
        if not isinstance(body["instructions"], str):
            _refuse(f"a string, got {body['instructions']!r}"[:200], "instructions")
        out.append({"role": "system", "content": body["instructions"]})
        echo.sources.append("instructions")
    if isinstance(items, str):
        out.append({"role": "user", "content": items})
        echo.sources.append("input")
        return out
    if not isinstance(items, list) or not items:
        _refuse(f"a string, or a non-empty list of items, got {items!r}"[:200], "input")
    reasoning: tuple[str, str] | None = None  # (its text, its param): for the assistant turn after it
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            _refuse(f"an item object, got {item!r}"[:200], where)
        kind = item.get("type", "message" if "role" in item else None)
        last = out[-1] if out else None
        if kind == "message":
            _keys(item, {"type", "role", "content", "phase"}, where)
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                _refuse(f"role: 'user', 'system', 'developer' or 'assistant', got {role!r}", where)
            message = {"role": role, "content": _text(item.get("content"), where + ".content")}
            if role == "assistant" and reasoning is not None:
                message["reasoning_content"], reasoning = reasoning[0], None
            out.append(message)
        elif kind == "function_call":
            _keys(item, {"type", "call_id", "name", "arguments"}, where)
            for key in ("call_id", "name", "arguments"):
                if not isinstance(item.get(key), str):
                    _refuse(f"{key}: a string, got {item.get(key)!r}"[:200], where)
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if reasoning is None and last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)  # the calls of the assistant turn before
                continue
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            if reasoning is not None:
                message["reasoning_content"], reasoning = reasoning[0], None
            out.append(message)
        elif kind == "function_call_output":
            _keys(item, {"type", "call_id", "output"}, where)
            if not isinstance(item.get("call_id"), str):
                _refuse(f"call_id: a string, got {item.get('call_id')!r}"[:200], where)
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": _text(item.get("output"), where + ".output")})
        elif kind == "reasoning":
            _keys(item, {"type", "summary", "content", "encrypted_content"}, where)
            if item.get("encrypted_content") is not None:
                _refuse("encrypted_content: dsv4 neither makes nor reads encrypted reasoning (send its content)",
                        where + ".encrypted_content")
            if reasoning is not None:
                _refuse("a second reasoning item before the assistant turn of the first", where)
            texts = _reasoning_texts(item.get("content"), "reasoning_text", where + ".content")
            if not texts:  # no content: its summary is what there is
                texts = _reasoning_texts(item.get("summary"), "summary_text", where + ".summary")
            reasoning = ("\n\n".join(texts), where)
            continue
        else:
            _refuse(f"type: 'message', 'function_call', 'function_call_output' or 'reasoning' (dsv4 serves text and "
                    f"function tools), got {kind!r}", where)
        echo.sources.append(where)
    if reasoning is not None:
        _refuse("a reasoning item belongs to the assistant message or function_call after it; none follows",
                reasoning[1])
    return out


def _reasoning_texts(parts, kind: str, param: str) -> list[str]:
    """The texts of a reasoning item's content (reasoning_text parts) or summary (summary_text parts)."""
    parts = [] if parts is None else parts
    if not isinstance(parts, list) or not all(isinstance(p, dict) and p.get("type") == kind
                                               and isinstance(p.get("text"), str) for p in parts):
        _refuse(f"a list of {kind} parts, got {parts!r}"[:200], param)
    return [p["text"] for p in parts]


def _tools(tools) -> list:
    if not isinstance(tools, list):
        _refuse(f"a list of function tools, got {tools!r}"[:200], "tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            _refuse(f"type: 'function' (dsv4 serves function tools only), got {tool!r}"[:200], f"tools[{i}]")
        extra = set(tool) - {"type", "name", "description", "parameters", "strict"}
        if extra:
            _refuse(f"not a field of a function tool: {sorted(extra)}", f"tools[{i}]")
        out.append({"type": "function", "function": {k: tool[k] for k in tool if k != "type"}})
    return out


def _tool_choice(v):
    if isinstance(v, str):
        return v  # auto | none | required, checked by the chat request
    if isinstance(v, dict) and v.get("type") == "function":
        if set(v) - {"type", "name"} or not isinstance(v.get("name"), str):
            _refuse(f"{{type: 'function', name}}, got {v!r}"[:200], "tool_choice")
        return {"type": "function", "function": {"name": v["name"]}}
    if isinstance(v, dict) and v.get("type") == "allowed_tools":
        if set(v) - {"type", "mode", "tools"} or not isinstance(v.get("tools"), list):
            _refuse(f"{{type: 'allowed_tools', mode, tools}}, got {v!r}"[:200], "tool_choice")
        named = []
        for j, t in enumerate(v["tools"]):
            if not isinstance(t, dict) or t.get("type") != "function" or set(t) - {"type", "name"}:
                _refuse(f"{{type: 'function', name}} (function tools only), got {t!r}"[:200], f"tool_choice.tools[{j}]")
            named.append({"type": "function", "function": {"name": t.get("name")}})
        return {"type": "allowed_tools", "allowed_tools": {"mode": v.get("mode"), "tools": named}}
    _refuse(f"'auto', 'none', 'required', {{type: 'function', name}} or {{type: 'allowed_tools', mode, tools}}, "
            f"got {v!r}"[:300], "tool_choice")


def _text_format(text):
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        _refuse(f"an object of format, got {text!r}"[:200], "text")
    if text.get("verbosity") is not None:
        _refuse(f"null only (DeepSeek-V4 has no verbosity setting), got {text['verbosity']!r}", "text.verbosity")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        _refuse(f"type 'text', 'json_object' or 'json_schema', got {fmt!r}"[:200], "text.format")
    if fmt["type"] != "json_schema":
        return dict(fmt)
    spec = {k: fmt[k] for k in fmt if k != "type"}
    return {"type": "json_schema", "json_schema": spec}


def _reasoning(v) -> str | None:
    if not isinstance(v, dict) or set(v) - {"effort", "summary", "generate_summary"}:
        _refuse(f"an object of effort, got {v!r}"[:200], "reasoning")
    for key in ("summary", "generate_summary"):
        if v.get(key) is not None:
            _refuse(f"null only: dsv4 returns the reasoning itself (a reasoning item's content), not a summary, got "
                    f"{v[key]!r}", f"reasoning.{key}")
    effort = v.get("effort")
    if effort is not None and effort not in EFFORTS:
        _refuse(f"'none' (thinking off), 'high' (DeepSeek-V4's thinking mode) or 'max' / 'xhigh' (at its maximum "
                f"effort), got {effort!r}", "reasoning.effort")
    return effort


# ---- the response -------------------------------------------------------------------------------------------------

def response_id() -> str:
    return "resp_" + uuid.uuid4().hex


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def shell(echo: Echo, rid: str, created: int, model: str, status: str) -> dict:
    """The response object without its output and usage (what response.created carries)."""
    req = echo.request
    text = req.get("text") or {}
    return {"id": rid, "object": "response", "created_at": created, "status": status, "background": False,
            "error": None, "incomplete_details": None, "instructions": req.get("instructions"),
            "max_output_tokens": req.get("max_output_tokens"), "max_tool_calls": None, "model": model,
            "output": [], "parallel_tool_calls": req.get("parallel_tool_calls") is not False,
            "previous_response_id": None, "reasoning": {"effort": (req.get("reasoning") or {}).get("effort"),
                                                        "summary": None},
            "service_tier": req.get("service_tier") or "default", "store": False,
            "temperature": 1.0 if req.get("temperature") is None else req["temperature"],
            "text": {"format": text.get("format") or {"type": "text"}, "verbosity": None},
            "tool_choice": req.get("tool_choice") or "auto", "tools": req.get("tools") or [],
            "top_p": 1.0 if req.get("top_p") is None else req["top_p"], "truncation": "disabled",
            "metadata": req.get("metadata") or {}, "user": req.get("user"), "usage": None}


def usage(chat_usage: dict, reasoning_tokens: int) -> dict:
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"input_tokens": chat_usage["prompt_tokens"], "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": chat_usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens}, "total_tokens": chat_usage["total_tokens"]}


def _status(finish: str) -> str:
    return "incomplete" if finish == "length" else "completed"


def response(echo: Echo, rid: str, created: int, model: str, message: dict, finish: str, chat_usage: dict,
             reasoning_tokens: int) -> dict:
    """The whole response of one chat choice: its message (content, reasoning_content, tool_calls) as output items."""
    status = _status(finish)
    out = shell(echo, rid, created, model, status)
    if message.get("reasoning_content"):
        out["output"].append(reasoning_item(_item_id("rs"), message["reasoning_content"], status))
    if message.get("content") or not (message.get("tool_calls") or message.get("reasoning_content")):
        out["output"].append(message_item(_item_id("msg"), message.get("content") or "", status))
    for call in message.get("tool_calls") or ():
        out["output"].append(call_item(_item_id("fc"), call, "completed"))
    out["usage"] = usage(chat_usage, reasoning_tokens)
    if status == "incomplete":
        out["incomplete_details"] = {"reason": "max_output_tokens"}
    return out


def reasoning_item(item_id: str, text: str, status: str) -> dict:
    return {"type": "reasoning", "id": item_id, "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}] if text else []}


def _output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str) -> dict:
    return {"type": "message", "id": item_id, "role": "assistant", "status": status,
            "content": [] if text is None else [_output_text(text)]}


def call_item(item_id: str, call: dict, status: str) -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call["id"], "name": call["function"]["name"],
            "arguments": call["function"]["arguments"], "status": status}


class Events:
    """The Responses stream of one choice: chat deltas in (content, reasoning_content, tool_calls, as the chat
    stream's), typed events out. Items open as their text starts and close when another kind of output follows or
    the reply ends: a reasoning item (response.reasoning_text.delta), a message (response.output_text.delta inside
    its one output_text part), a function_call (its arguments in one response.function_call_arguments.delta, the
    call being whole when the parser yields it)."""

    def __init__(self, echo: Echo, rid: str, created: int, model: str):
        self.echo, self.rid, self.created, self.model = echo, rid, created, model
        self.sequence = 0
        self.output: list[dict] = []
        self.open: dict | None = None  # the item being written: its record in self.output
        self.text = ""

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def start(self) -> list[dict]:
        body = shell(self.echo, self.rid, self.created, self.model, "in_progress")
        return [self._event("response.created", response=body), self._event("response.in_progress", response=body)]

    def delta(self, d: dict) -> list[dict]:
        events = []
        if d.get("reasoning_content"):
            events += self._write("reasoning", d["reasoning_content"])
        if d.get("content"):
            events += self._write("message", d["content"])
        for call in d.get("tool_calls") or ():
            events += self._close("completed")
            item = call_item(_item_id("fc"), call, "in_progress")
            index = len(self.output)
            self.output.append(item)
            events.append(self._event("response.output_item.added", output_index=index,
                                      item={**item, "arguments": ""}))
            events.append(self._event("response.function_call_arguments.delta", item_id=item["id"],
                                      output_index=index, delta=item["arguments"]))
            events.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                      output_index=index, arguments=item["arguments"], name=item["name"]))
            item["status"] = "completed"
            events.append(self._event("response.output_item.done", output_index=index, item=dict(item)))
        return events

    def _write(self, kind: str, text: str) -> list[dict]:
        events = []
        if self.open is None or self.open["type"] != kind:
            events += self._close("completed")
            index = len(self.output)
            if kind == "reasoning":
                item = reasoning_item(_item_id("rs"), "", "in_progress")
                self.output.append(item)
                events.append(self._event("response.output_item.added", output_index=index, item=dict(item)))
            else:
                item = message_item(_item_id("msg"), None, "in_progress")
                self.output.append(item)
                events.append(self._event("response.output_item.added", output_index=index, item=dict(item)))
                events.append(self._event("response.content_part.added", item_id=item["id"], output_index=index,
                                          content_index=0, part=_output_text("")))
            self.open, self.text = item, ""
        self.text += text
        index = len(self.output) - 1
        kind_event = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        events.append(self._event(kind_event, item_id=self.open["id"], output_index=index, content_index=0,
                                  delta=text, **extra))
        return events

    def _close(self, status: str) -> list[dict]:
        item, self.open = self.open, None
        if item is None:
            return []
        index = self.output.index(item)
        events = []
        if item["type"] == "reasoning":
            item["content"] = [{"type": "reasoning_text", "text": self.text}]
            events.append(self._event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                      content_index=0, text=self.text))
        else:
            item["content"] = [_output_text(self.text)]
            events.append(self._event("response.output_text.done", item_id=item["id"], output_index=index,
                                      content_index=0, text=self.text, logprobs=[]))
            events.append(self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                      content_index=0, part=_output_text(self.text)))
        item["status"] = status
        events.append(self._event("response.output_item.done", output_index=index, item=dict(item)))
        return events

    def finish(self, finish: str, chat_usage: dict, reasoning_tokens: int) -> list[dict]:
        status = _status(finish)
        events = self._close(status)
        if not self.output:  # an empty reply is still a message, as the whole response has one
            item = message_item(_item_id("msg"), "", status)
            self.output.append(item)
            events.append(self._event("response.output_item.added", output_index=0,
                                      item={**item, "content": [], "status": "in_progress"}))
            events.append(self._event("response.output_item.done", output_index=0, item=item))
        body = shell(self.echo, self.rid, self.created, self.model, status)
        body["output"], body["usage"] = self.output, usage(chat_usage, reasoning_tokens)
        if status == "incomplete":
            body["incomplete_details"] = {"reason": "max_output_tokens"}
        return events + [self._event("response.completed" if status == "completed" else "response.incomplete",
                                     response=body)]


def sse(event: dict) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
