"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) over the chat path: what DeepSeek's own
API offers beside OpenAI's, so that a client written for it (Claude Code among them) can run on DeepSeek-V4 here.

A request becomes a chat request (`to_chat`): `system` the system message, `messages` the conversation (a user
message's tool_result blocks become tool messages, its text blocks a user message after them; an assistant message's
thinking blocks its reasoning_content, its tool_use blocks its tool_calls), `tools` chat function tools
(input_schema their parameters), `tool_choice` its chat form (auto, any: required, tool: a named function, none;
disable_parallel_tool_use: parallel_tool_calls false), `thinking` the thinking switch, `output_config` the reasoning
effort and the JSON format, `stop_sequences` stop, `max_tokens` max_completion_tokens. The chat reply comes back as
content blocks (`message`: thinking, text, tool_use), whole or as the Messages stream's events (`Events`).

Read past, as DeepSeek's own Anthropic endpoint does: `cache_control` (a caching hint; the prefix cache, where on,
caches by itself), a thinking block's `signature` (dsv4 makes none: its thinking blocks carry ""), `thinking.
budget_tokens` (DeepSeek-V4's thinking has no budget), a tool_result's `is_error` (its content carries the error; the
encoding has no flag). Refused (400 naming the field): images and documents, server tools, redacted thinking,
adaptive thinking, efforts DeepSeek-V4 lacks, and the fields of Anthropic's platform (container, ...).
Errors are Anthropic-shaped: {"type": "error", "error": {"type", "message"}}.
"""

from __future__ import annotations

import json
import uuid

from .protocol import RequestError

# Fields taken as the chat request takes them: the sampler's (Anthropic's classic ones) and vLLM's extensions.
PASSED = ("model", "temperature", "top_p", "top_k", "stream", "seed", "min_p", "repetition_penalty")
CONVERTED = ("max_tokens", "messages", "system", "tools", "tool_choice", "thinking", "output_config",
             "stop_sequences", "metadata", "service_tier")
_REFUSED = ("container", "diagnostics", "inference_geo", "speed", "user_profile_id", "workspace_id", "mcp_servers",
            "context_management", "cache_control")
_READ_PAST = {"cache_control"}  # a block's caching hint
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}  # chat finish -> stop_reason ("stop": below)


def _refuse(message: str, param: str):
    raise RequestError(f"{param}: {message}"[:400], param)


def error_body(e: RequestError) -> dict:
    kind = {401: "authentication_error", 404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
            500: "api_error", 503: "overloaded_error"}.get(e.status, "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": e.message}}


def _blocks(content, param: str) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        _refuse(f"a string or a list of content blocks, got {content!r}"[:200], param)
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            _refuse(f"a content block {{type, ...}}, got {block!r}"[:200], f"{param}[{j}]")
    return content


def _text(block: dict, param: str) -> str:
    if set(block) - {"type", "text", "citations"} - _READ_PAST or not isinstance(block.get("text"), str):
        _refuse(f"a text block {{type: 'text', text}}, got {block!r}"[:200], param)
    if block.get("citations"):
        _refuse("citations: not served (dsv4 reads text only)", param)
    return block["text"]


def _system(system) -> str:
    if isinstance(system, str):
        return system
    return "\n\n".join(_text(b, f"system[{j}]") for j, b in enumerate(_blocks(system, "system")))


def _tool_result(block: dict, param: str) -> dict:
    if set(block) - {"type", "tool_use_id", "content", "is_error"} - _READ_PAST:
        _refuse(f"not a field of a tool_result block: {sorted(set(block) - {'type', 'tool_use_id', 'content'})}",
                param)
    if not isinstance(block.get("tool_use_id"), str):
        _refuse("tool_use_id: a string", param)
    content = block.get("content", "")
    if not isinstance(content, str):
        parts = _blocks(content, param + ".content")
        bad = [j for j, p in enumerate(parts) if p["type"] != "text"]
        if bad:
            _refuse("text blocks only (dsv4 reads text)", f"{param}.content[{bad[0]}]")
        content = "\n\n".join(_text(p, f"{param}.content[{j}]") for j, p in enumerate(parts))
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": content}


def _messages(body: dict, sources: list[str]) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        _refuse("a non-empty list of {role, content}", "messages")
    out = []
    if body.get("system") is not None:
        out.append({"role": "system", "content": _system(body["system"])})
        sources.append("system")
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant") or set(m) - {"role", "content"}:
            _refuse(f"{{role: 'user' | 'assistant', content}}, got {m!r}"[:200], where)
        blocks = _blocks(m.get("content"), where + ".content")
        if m["role"] == "user":
            texts = []
            for j, b in enumerate(blocks):
                param = f"{where}.content[{j}]"
                if b["type"] == "tool_result":
                    out.append(_tool_result(b, param))
                    sources.append(param)
                elif b["type"] == "text":
                    texts.append(_text(b, param))
                else:
                    _refuse(f"type: 'text' or 'tool_result' in a user message (dsv4 reads text), got {b['type']!r}",
                            param)
            if texts or not blocks:
                out.append({"role": "user", "content": "\n\n".join(texts)})
                sources.append(where)
            continue
        message = {"role": "assistant", "content": None}
        texts, reasoning, calls = [], [], []
        for j, b in enumerate(blocks):
            param = f"{where}.content[{j}]"
            if b["type"] == "text":
                texts.append(_text(b, param))
            elif b["type"] == "thinking":
                if not isinstance(b.get("thinking"), str) or set(b) - {"type", "thinking", "signature"} - _READ_PAST:
                    _refuse("a thinking block {type: 'thinking', thinking, signature}", param)
                reasoning.append(b["thinking"])
            elif b["type"] == "tool_use":
                if set(b) - {"type", "id", "name", "input", "caller"} - _READ_PAST or not isinstance(b.get("id"), str) \
                        or not isinstance(b.get("name"), str) or not isinstance(b.get("input", {}), dict):
                    _refuse("a tool_use block {type: 'tool_use', id, name, input (an object)}", param)
                calls.append({"id": b["id"], "type": "function",
                              "function": {"name": b["name"], "arguments": json.dumps(b.get("input", {}),
                                                                                      ensure_ascii=False)}})
            else:
                _refuse(f"type: 'text', 'thinking' or 'tool_use' in an assistant message, got {b['type']!r}", param)
        if texts:
            message["content"] = "".join(texts)
        if reasoning:
            message["reasoning_content"] = "".join(reasoning)
        if calls:
            message["tool_calls"] = calls
        if message["content"] is None and not calls:
            message["content"] = ""
        out.append(message)
        sources.append(where)
    return out


def _tools(tools) -> list:
    if not isinstance(tools, list):
        _refuse(f"a list of tools {{name, description, input_schema}}, got {tools!r}"[:200], "tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") not in (None, "custom"):
            _refuse(f"a custom tool {{name, description, input_schema}} (dsv4 runs no server tools), got {t!r}"[:200],
                    f"tools[{i}]")
        extra = set(t) - {"type", "name", "description", "input_schema", "strict"} - _READ_PAST
        if extra:
            _refuse(f"not a field of a tool: {sorted(extra)}", f"tools[{i}]")
        function = {"name": t.get("name"), "parameters": t.get("input_schema")}
        for key in ("description", "strict"):
            if t.get(key) is not None:
                function[key] = t[key]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(v) -> tuple[object, bool | None]:
    """(chat tool_choice, parallel_tool_calls) of Anthropic's tool_choice."""
    kind = v.get("type") if isinstance(v, dict) else None
    allowed = {"auto": {"disable_parallel_tool_use"}, "any": {"disable_parallel_tool_use"},
               "tool": {"name", "disable_parallel_tool_use"}, "none": set()}
    if not isinstance(kind, str) or kind not in allowed or set(v) - allowed[kind] - {"type"}:
        _refuse(f"{{type: 'auto' | 'any' | 'tool' (name) | 'none', disable_parallel_tool_use?}}, got {v!r}"[:200],
                "tool_choice")
    parallel = False if v.get("disable_parallel_tool_use") else None
    if kind == "tool":
        return {"type": "function", "function": {"name": v.get("name")}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[kind], parallel


def _thinking(v) -> bool:
    kind = v.get("type") if isinstance(v, dict) else None
    if kind == "disabled" and set(v) == {"type"}:
        return False
    if kind == "enabled" and not set(v) - {"type", "budget_tokens", "display"}:
        if v.get("display") not in (None, "summarized"):
            _refuse(f"display: 'summarized' or null (dsv4 returns the thinking itself), got {v['display']!r}",
                    "thinking.display")
        return True
    _refuse(f"{{type: 'enabled', budget_tokens}} or {{type: 'disabled'}} (DeepSeek-V4 thinks or does not: no adaptive "
            f"thinking), got {v!r}"[:300], "thinking")


def to_chat(body) -> tuple[dict, list[str]]:
    """The chat request of a Messages request, and where each chat message came from (for errors' fields)."""
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - set(PASSED) - set(CONVERTED) - set(_REFUSED))
    if unknown:
        _refuse("not a field of this endpoint (dsv4 serve refuses what it would otherwise ignore)", unknown[0])
    for name in _REFUSED:
        if body.get(name) is not None:
            _refuse(f"not served by dsv4 (null only), got {body[name]!r}"[:200], name)
    if body.get("service_tier") not in (None, "auto", "standard_only"):
        _refuse(f"'auto' or 'standard_only', got {body['service_tier']!r}", "service_tier")
    if "max_tokens" not in body:
        _refuse("required", "max_tokens")
    sources: list[str] = []
    chat = {k: body[k] for k in PASSED if k in body}
    chat["messages"] = _messages(body, sources)
    chat["max_completion_tokens"] = body["max_tokens"]
    if body.get("stop_sequences"):
        chat["stop"] = body["stop_sequences"]
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"], parallel = _tool_choice(body["tool_choice"])
        if parallel is not None:
            chat["parallel_tool_calls"] = parallel
    if body.get("thinking") is not None:
        chat["thinking"] = {"type": "enabled" if _thinking(body["thinking"]) else "disabled"}
    config = body.get("output_config")
    if config is not None:
        if not isinstance(config, dict) or set(config) - {"effort", "format"}:
            _refuse(f"an object of effort and format, got {config!r}"[:200], "output_config")
        if config.get("effort") is not None:
            chat["reasoning_effort"] = config["effort"]
        fmt = config.get("format")
        if fmt is not None:
            if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or set(fmt) - {"type", "schema"}:
                _refuse(f"{{type: 'json_schema', schema}}, got {fmt!r}"[:200], "output_config.format")
            chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema":
                                                                              fmt.get("schema")}}
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict) or set(metadata) - {"user_id"}:
            _refuse(f"an object of user_id, got {metadata!r}"[:200], "metadata")
        if metadata.get("user_id") is not None:
            chat["user"] = metadata["user_id"]
    return chat, sources


def param(chat_param: str | None, sources: list[str]) -> str | None:
    """A chat error's field as the Messages request's."""
    if chat_param is None:
        return None
    if chat_param.startswith("messages["):
        k = int(chat_param[len("messages["):chat_param.index("]")])
        rest = chat_param[chat_param.index("]") + 1:].replace(".tool_call_id", ".tool_use_id")
        return (sources[k] if k < len(sources) else "messages") + rest
    for chat, ours in (("max_completion_tokens", "max_tokens"), ("stop", "stop_sequences"),
                       ("response_format.json_schema.schema", "output_config.format.schema"),
                       ("response_format", "output_config.format"), ("reasoning_effort", "output_config.effort"),
                       ("tool_choice.function.name", "tool_choice.name"), ("user", "metadata.user_id")):
        if chat_param.startswith(chat):
            return ours + chat_param[len(chat):]
    if chat_param.startswith("tools[") and ".function" in chat_param:
        head, _, rest = chat_param.partition(".function")
        return head + {".parameters": ".input_schema"}.get(rest, rest)
    return chat_param


# ---- the reply ----------------------------------------------------------------------------------------------------

def message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def _tool_use(call: dict) -> dict:
    return {"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
            "input": json.loads(call["function"]["arguments"])}


def stop_reason(finish: str, stop_sequence: str | None) -> str:
    if finish == "stop":
        return "stop_sequence" if stop_sequence is not None else "end_turn"
    return STOP_REASONS.get(finish, "end_turn")


def usage(chat_usage: dict, output_tokens: int | None = None) -> dict:
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"input_tokens": chat_usage["prompt_tokens"] - cached, "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0,
            "output_tokens": chat_usage["completion_tokens"] if output_tokens is None else output_tokens}


def message(mid: str, model: str, chat_message: dict, finish: str, stop_sequence: str | None,
            chat_usage: dict) -> dict:
    """The whole Messages response of one chat choice."""
    content = []
    if chat_message.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": chat_message["reasoning_content"], "signature": ""})
    if chat_message.get("content"):
        content.append({"type": "text", "text": chat_message["content"]})
    content += [_tool_use(c) for c in chat_message.get("tool_calls") or ()]
    return {"id": mid, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop_reason(finish, stop_sequence), "stop_sequence": stop_sequence,
            "usage": usage(chat_usage)}


class Events:
    """The Messages stream of one choice: chat deltas in, Anthropic's events out (message_start, a block's
    content_block_start / _delta / _stop as its text starts and ends, message_delta with the stop_reason and the
    usage, message_stop). A tool_use block's input comes in one input_json_delta (the call is whole when the parser
    yields it)."""

    def __init__(self, mid: str, model: str, input_tokens: int):
        self.mid, self.model, self.input_tokens = mid, model, input_tokens
        self.index = -1  # the open block's index
        self.kind: str | None = None  # the open block's type

    def start(self) -> list[dict]:
        return [{"type": "message_start", "message": {
            "id": self.mid, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0}}}]

    def delta(self, d: dict) -> list[dict]:
        events = []
        if d.get("reasoning_content"):
            events += self._write("thinking", d["reasoning_content"])
        if d.get("content"):
            events += self._write("text", d["content"])
        for call in d.get("tool_calls") or ():
            events += self._close()
            self.index += 1
            block = _tool_use(call)
            events.append({"type": "content_block_start", "index": self.index,
                           "content_block": {**block, "input": {}}})
            events.append({"type": "content_block_delta", "index": self.index,
                           "delta": {"type": "input_json_delta", "partial_json": call["function"]["arguments"]}})
            events.append({"type": "content_block_stop", "index": self.index})
        return events

    def _write(self, kind: str, text: str) -> list[dict]:
        events = []
        if self.kind != kind:
            events += self._close()
            self.index += 1
            self.kind = kind
            block = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else \
                {"type": "text", "text": ""}
            events.append({"type": "content_block_start", "index": self.index, "content_block": block})
        delta = {"type": "thinking_delta", "thinking": text} if kind == "thinking" else \
            {"type": "text_delta", "text": text}
        events.append({"type": "content_block_delta", "index": self.index, "delta": delta})
        return events

    def _close(self) -> list[dict]:
        if self.kind is None:
            return []
        events = []
        if self.kind == "thinking":  # the block's signature, as Anthropic ends a thinking block (dsv4's is empty)
            events.append({"type": "content_block_delta", "index": self.index,
                           "delta": {"type": "signature_delta", "signature": ""}})
        self.kind = None
        return events + [{"type": "content_block_stop", "index": self.index}]

    def finish(self, finish: str, stop_sequence: str | None, output_tokens: int) -> list[dict]:
        return self._close() + [
            {"type": "message_delta", "delta": {"stop_reason": stop_reason(finish, stop_sequence),
                                                "stop_sequence": stop_sequence},
             "usage": {"output_tokens": output_tokens}},
            {"type": "message_stop"}]


def sse(event: dict) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
