"""Chat for DeepSeek-V4: the prompt (DeepSeek's chat encoding, or a checkpoint's own jinja template)
and the reply (reasoning, content and DSML tool calls parsed out of the generated text, streamed).

The encoding, as DeepSeek-V4's reference encoder (`encoding/encoding_dsv4.py` in the model repo)
writes it; BOS first, then per message:

    system      its content (request-level tools: "\\n\\n## Tools ..." appended to the leading
                system message, or to an empty system message put first)
    user        <｜User｜>content; tool results go here: a `tool` message joins the user turn
                after it as <tool_result>content</tool_result>, blocks of one turn joined by
                "\\n\\n" (consecutive user messages merge the same way), in the order of the calls
    assistant   [reasoning</think>]content[\\n\\n<｜DSML｜tool_calls>...</｜DSML｜tool_calls>]
                <｜end▁of▁sentence｜>

and after a user turn that an assistant turn (or the generation) follows: <｜Assistant｜> then
</think> (chat mode) or <think> (thinking mode). In thinking mode without tools, assistant turns
before the last user turn lose their reasoning; with tools every assistant turn keeps
reasoning</think>. A tool call is

    <｜DSML｜invoke name="NAME">
    <｜DSML｜parameter name="KEY" string="true">raw string</｜DSML｜parameter>
    <｜DSML｜parameter name="KEY" string="false">JSON value</｜DSML｜parameter>
    </｜DSML｜invoke>

invokes joined by "\\n" inside the tool_calls block. Our choices where the reference has none or
means something else: OpenAI's `developer` message is a system message (the reference's
developer role is its search agent's user turn, which DeepSeek's API refuses); a system message
after the first other message is refused (the reference glues its text to the turn before); a
conversation ending in a system or assistant message still gets the generation prompt
<｜Assistant｜></think> (or <think>).

Sources read to learn the format (the code here is ours):
- deepseek-ai/DeepSeek-V4-Flash encoding/encoding_dsv4.py, read through public copies
  (flagos-ai/DeepSeek-V4-FlagOS encoding_dsv4.py, "copied from" the ModelScope model repo;
  supermy/ds4rs encoding/encoding_dsv4.py): templates, merge of tool messages, drop of reasoning,
  REASONING_EFFORT_MAX, TOOLS_TEMPLATE, parse_message_from_completion_text.
- vLLM vllm/tokenizers/deepseek_v4.py (request-level tools attached to the leading system
  message; the thinking switch from chat_template_kwargs `thinking` / `enable_thinking`),
  vllm/tool_parsers/deepseekv4_tool_parser.py and deepseekv32_tool_parser.py (V4 wraps invokes in
  <｜DSML｜tool_calls>; string="false" values are JSON; content before the block is content).
- HF transformers utils/chat_template_utils.py (how a chat template is rendered: an immutable
  sandboxed jinja2 environment, trim_blocks + lstrip_blocks, loopcontrols, a `tojson` filter
  without HTML escaping, `raise_exception`, `strftime_now`, `{% generation %}` blocks).
- The model card: DeepSeek-V4 ships no jinja chat template, so the hand encoding is the path for
  the official checkpoint; a checkpoint that ships one (tokenizer_config.json `chat_template` or
  chat_template.jinja) is rendered with it.
"""

from __future__ import annotations

import functools
import json
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Literal

import jinja2
import jinja2.ext
import jinja2.sandbox
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError, ValidationInfo,
                      field_validator, model_validator)
from pydantic_core import PydanticCustomError

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
THINK, END_THINK = "<think>", "</think>"
DSML = "｜DSML｜"
CALLS_OPEN, CALLS_CLOSE = f"<{DSML}tool_calls>", f"</{DSML}tool_calls>"
INVOKE_OPEN, INVOKE_CLOSE = f"<{DSML}invoke", f"</{DSML}invoke>"
CALLS_LEAD = "\n\n"  # the encoder puts the block two newlines after the content

# The tools section the model was trained on (byte-exact: it is part of the prompt format).
TOOLS_PROMPT = f"""## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<{DSML}tool_calls>" block like the following:

<{DSML}tool_calls>
<{DSML}invoke name="$TOOL_NAME">
<{DSML}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{DSML}parameter>
...
</{DSML}invoke>
<{DSML}invoke name="$TOOL_NAME2">
...
</{DSML}invoke>
</{DSML}tool_calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by {THINK}), you MUST output your complete reasoning inside {THINK}...{END_THINK} BEFORE any tool calls or final response.

Otherwise, output directly after {END_THINK} with tool calls or final response.

### Available Tool Schemas

{{schemas}}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
"""


class ChatError(ValueError):
    """A conversation the encoding cannot take, naming the field (`param`) at fault."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message, self.param = message, param


# ---- request types: messages, tools, tool_choice, the thinking switch --------------------------

def _refuse(message: str):
    # "{message}" as the template: the text itself may hold braces.
    raise PydanticCustomError("dsv4", "{message}", {"message": message})


ROLES = ("system", "developer", "user", "assistant", "tool")


def _role(v):
    if v not in ROLES:
        _refuse(f"one of {', '.join(repr(r) for r in ROLES)}, got {v!r}")
    return v


def _content(v):
    if isinstance(v, list):  # [{"type": "text", "text": ...}, ...]
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   and set(p) <= {"type", "text"} for p in v):
            _refuse("text parts only ({type: 'text', text})")
        return "".join(p["text"] for p in v)
    if v is not None and not isinstance(v, str):
        _refuse(f"a string or a list of text parts, got {v!r}")
    return v


def _nonempty(v):
    if not isinstance(v, str) or not v:
        _refuse(f"a non-empty string, got {v!r}")
    return v


class Function(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Annotated[str, BeforeValidator(_nonempty)]
    arguments: str


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: Annotated[str, BeforeValidator(_nonempty)]
    type: Literal["function"]
    function: Function


# Fields the openai client writes into a history message it got back (`message.model_dump()`):
# null they say nothing and are dropped; anything else is refused as an unknown field.
_NULL_FIELDS = ("name", "refusal", "annotations", "audio", "function_call")


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Annotated[str, BeforeValidator(_role)]
    content: Annotated[str | None, BeforeValidator(_content)] = Field(None, validate_default=True)
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None  # DeepSeek's API takes it back in a tool-call loop

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, v):
        if isinstance(v, dict):
            return {k: x for k, x in v.items() if not (k in _NULL_FIELDS and x in (None, []))}
        return v

    @field_validator("content")
    @classmethod
    def _null_only_for_assistant(cls, v, info: ValidationInfo):
        role = info.data.get("role")
        if v is None and role not in (None, "assistant"):  # OpenAI: an assistant's content may be null
            _refuse(f"a string or a list of text parts (a {role} message needs one; null only for an assistant "
                    "message), got null")
        return v

    @model_validator(mode="after")
    def _fields_of_role(self):
        role = self.role
        if self.tool_calls is not None and role != "assistant":
            _refuse(f"tool_calls: only on an assistant message, not on a {role} message")
        if self.reasoning_content is not None and role != "assistant":
            _refuse(f"reasoning_content: only on an assistant message, not on a {role} message")
        if (self.tool_call_id is None) != (role != "tool"):
            _refuse("tool_call_id: required on a tool message" if role == "tool"
                    else f"tool_call_id: only on a tool message, not on a {role} message")
        return self


def check_messages(v):
    if not isinstance(v, list) or not v:
        _refuse("a non-empty list of {role, content}")
    return v


Messages = Annotated[list[Message], BeforeValidator(check_messages)]


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Annotated[str, BeforeValidator(_nonempty)]
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None  # true: the call's arguments follow `parameters` (a grammar: dsv4.serve.grammar)


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionDef

    def schema(self) -> dict:
        """What the prompt shows of the tool: name, description, parameters (as the client wrote them)."""
        return self.function.model_dump(exclude_none=True, exclude={"strict"})


def _tools(v):
    if v is not None and not isinstance(v, list):
        _refuse(f"a list of {{type: 'function', function: {{name, description?, parameters?, strict?}}}}, got {v!r}")
    return v


Tools = Annotated[list[Tool] | None, BeforeValidator(_tools)]


class FunctionName(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Annotated[str, BeforeValidator(_nonempty)]


class NamedTool(BaseModel):
    """{"type": "function", "function": {"name": ...}}: a tool_choice that forces one call of that function, or an
    entry of allowed_tools."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionName


class AllowedTools(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Literal["auto", "required"]
    tools: Annotated[list[NamedTool], Field(min_length=1)]


class AllowedToolsChoice(BaseModel):
    """{"type": "allowed_tools", "allowed_tools": {"mode": "auto" | "required", "tools": [NamedTool, ...]}}: every
    tool stays in the prompt, the calls are limited to these (OpenAI's)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


ToolChoice = Literal["auto", "none", "required"] | NamedTool | AllowedToolsChoice


def check_tool_choice(v):
    """'auto' (the default with tools), 'none' (the tools are left out of the prompt), 'required' (at least one
    call), a named function (one call of it) or allowed_tools; the last three by a grammar (ToolCalls)."""
    kinds = {"function": NamedTool, "allowed_tools": AllowedToolsChoice}
    if isinstance(v, dict) and isinstance(v.get("type"), str) and v["type"] in kinds:
        try:
            return kinds[v["type"]].model_validate(v)
        except ValidationError as e:  # one line naming the sub-field, as the request's other fields
            err = e.errors(include_url=False)[0]
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
            text = "not a field here" if err["type"] == "extra_forbidden" else err["msg"]
            _refuse(f"{where.lstrip('.')}: {text}"[:300])
    if v is not None and not (isinstance(v, str) and v in ("auto", "none", "required")):
        _refuse(f"'auto', 'none', 'required', {{type: 'function', function: {{name}}}} or {{type: 'allowed_tools', "
                f"allowed_tools: {{mode, tools}}}}, got {v!r}"[:300])
    return v


@dataclass(frozen=True)
class ToolCalls:
    """What a chat reply's tool calls are held to, by a grammar over DeepSeek-V4's DSML block (xgrammar's
    deepseek_v4 structural tag: dsv4.serve.grammar.compile_tool_calls): `tools` (the callable ones, the wire
    shape), `choice` ('auto': text or calls, 'required': at least one call, 'forced': one call of tools[0]),
    `parallel` (false: at most one call), `asked_by` (the request field that asked for the grammar), `positions`
    (each callable tool's index in the request's tools)."""

    tools: tuple[dict, ...]
    choice: Literal["auto", "required", "forced"]
    parallel: bool
    asked_by: str
    positions: tuple[int, ...]


def tool_calls(tools: list[Tool] | None, tool_choice, parallel_tool_calls: bool | None) -> ToolCalls | None:
    """The grammar a chat request's tools need (None: the calls are parsed from free text, as the model writes
    them). Asked for by tool_choice 'required', a named function or allowed_tools; by a tool with strict: true
    (its arguments follow its parameters); by parallel_tool_calls false (at most one call). A tool without strict:
    true keeps any arguments (OpenAI's strict, off by default). Raises ChatError naming the field."""
    if tool_choice not in (None, "auto", "none") and not tools:
        raise ChatError("tool_choice: only with tools", "tool_choice")
    if not tools or tool_choice == "none":
        return None
    names = [t.function.name for t in tools]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ChatError(f"tools: the function {repeated[0]!r} is listed twice", "tools")
    callable_, choice, asked_by = list(tools), "auto", None
    if isinstance(tool_choice, NamedTool):
        callable_, choice, asked_by = [_named(tools, tool_choice, "tool_choice.function.name")], "forced", "tool_choice"
    elif isinstance(tool_choice, AllowedToolsChoice):
        allowed = tool_choice.allowed_tools
        callable_ = [_named(tools, t, f"tool_choice.allowed_tools.tools[{i}].function.name")
                     for i, t in enumerate(allowed.tools)]
        callable_ = [t for i, t in enumerate(callable_) if t not in callable_[:i]]
        choice, asked_by = allowed.mode, "tool_choice"
    elif tool_choice == "required":
        choice, asked_by = "required", "tool_choice"
    strict = [i for i, t in enumerate(tools) if t.function.strict]
    if asked_by is None and strict:
        asked_by = f"tools[{strict[0]}].function.strict"
    if asked_by is None and parallel_tool_calls is False:
        asked_by = "parallel_tool_calls"
    if asked_by is None:
        return None
    wire = tuple({"type": "function", "function": {"name": t.function.name, "parameters": t.function.parameters,
                                                    "strict": bool(t.function.strict)}} for t in callable_)
    return ToolCalls(wire, choice, parallel_tool_calls is not False, asked_by,
                     tuple(tools.index(t) for t in callable_))


def _named(tools: list[Tool], ref: NamedTool, param: str) -> Tool:
    for t in tools:
        if t.function.name == ref.function.name:
            return t
    raise ChatError(f"{param}: {ref.function.name!r} is not one of the tools {[t.function.name for t in tools]}"[:300],
                    param)


TEMPLATE_SWITCHES = ("thinking", "enable_thinking")  # vLLM's spellings of the thinking switch
# The reasoning efforts DeepSeek-V4's encoding knows (its encoder asserts 'high', 'max' or none): 'none' is chat mode,
# 'high' the thinking mode as it is, 'max' (vLLM's 'xhigh' too) the thinking mode with REASONING_EFFORT_MAX first.
EFFORTS = ("none", "high", "max", "xhigh")
# Byte-exact, as the reference encoder writes it at the start of the first message (thinking mode, effort max).
REASONING_EFFORT_MAX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, "
    "rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n")


class Thinking(BaseModel):
    """DeepSeek's API switch: {"type": "enabled" | "disabled"}."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["enabled", "disabled"]


def _template_kwargs(v):
    if v is not None and not isinstance(v, dict):
        _refuse(f"an object of template variables, got {v!r}")
    for key in TEMPLATE_SWITCHES:
        if v and key in v and not isinstance(v[key], bool):
            _refuse(f"{key}: true or false, got {v[key]!r}")
    if v and "reasoning_effort" in v:
        check_effort(v["reasoning_effort"])
    return v


def check_effort(v):
    if v is not None and v not in EFFORTS:
        _refuse(f"reasoning_effort: one of {list(EFFORTS)} (DeepSeek-V4's thinking has two efforts: high and max), "
                f"got {v!r}")
    return v


TemplateKwargs = Annotated[dict | None, BeforeValidator(_template_kwargs)]


def thinking_switch(kwargs: dict | None, thinking: Thinking | None, effort: str | None = None) -> tuple[bool, bool]:
    """The thinking mode a request asks for, and whether at maximum effort: chat_template_kwargs {thinking |
    enable_thinking} (vLLM's spelling), thinking {type} (DeepSeek's API), reasoning_effort (the request's or
    chat_template_kwargs', vLLM's): 'none' asks for chat mode, 'high' for thinking, 'max' / 'xhigh' for thinking at
    maximum effort; off unless asked. Switches that disagree are a ChatError."""
    asked = {kwargs[k] for k in TEMPLATE_SWITCHES if kwargs and k in kwargs}
    if thinking is not None:
        asked.add(thinking.type == "enabled")
    if len(asked) > 1:
        raise ChatError("thinking: chat_template_kwargs and thinking disagree on the thinking mode", "thinking")
    efforts = {e for e in (effort, (kwargs or {}).get("reasoning_effort")) if e is not None}
    if len(efforts) > 1:
        raise ChatError(f"reasoning_effort: the request and chat_template_kwargs disagree ({sorted(efforts)})",
                        "reasoning_effort")
    if not efforts:
        return (asked.pop() if asked else False), False
    chosen = efforts.pop()
    if asked and asked != {chosen != "none"}:
        raise ChatError(f"reasoning_effort: {chosen!r} with thinking {'enabled' if asked.pop() else 'disabled'}",
                        "reasoning_effort")
    return chosen != "none", chosen in ("max", "xhigh")


_MESSAGES = TypeAdapter(Messages)
_TOOLS = TypeAdapter(Tools)


def _validated(adapter: TypeAdapter, value, name: str):
    try:
        return adapter.validate_python(value)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        param = name + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
        text = err["msg"] if err["type"] == "dsv4" else ("not a field here" if err["type"] == "extra_forbidden"
                                                          else f"{err['msg']}, got {err['input']!r}")
        raise ChatError(f"{param}: {text}", param) from None


# ---- the prompt ---------------------------------------------------------------------------------

def render(messages, tools=None, thinking: bool = False, template: str | None = None, bos: str = BOS,
           eos: str = EOS, template_kwargs: dict | None = None, effort_max: bool = False) -> str:
    """The prompt text of a conversation, ending with the generation prompt.

    `messages` and `tools` are OpenAI-shaped (dicts or the models above). With `template` (a
    checkpoint's jinja chat template) the template renders it as HF does, with `bos_token`,
    `eos_token`, `add_generation_prompt=True`, `thinking` and `enable_thinking`, and
    `template_kwargs` on top; otherwise DeepSeek-V4's encoding does, `bos` first. `effort_max` (thinking mode):
    REASONING_EFFORT_MAX before the first message, as the reference encoder puts it (a template gets
    `reasoning_effort` "max" or "high" instead). Raises ChatError.
    """
    msgs = _validated(_MESSAGES, messages, "messages")
    tool_list = _validated(_TOOLS, tools, "tools") or []
    _check_tool_results(msgs)
    if template is not None:
        effort = ("max" if effort_max else "high") if thinking else None
        return _render_template(template, msgs, tool_list, thinking, bos, eos,
                                {"reasoning_effort": effort, **(template_kwargs or {})})
    _check_system_first(msgs)
    prefix = REASONING_EFFORT_MAX if thinking and effort_max else ""
    return bos + prefix + _encode(msgs, [t.schema() for t in tool_list], thinking)


def _check_system_first(msgs: list[Message]):
    # The encoding has no marker for a system turn: a late one would read as part of the turn before.
    first_other = next((i for i, m in enumerate(msgs) if m.role not in ("system", "developer")), len(msgs))
    late = next((i for i, m in enumerate(msgs) if i > first_other and m.role in ("system", "developer")), None)
    if late is not None:
        raise ChatError(f"messages[{late}].role: system and developer messages come first", f"messages[{late}].role")


def _check_tool_results(msgs: list[Message]):
    """Each tool message answers a call of the assistant message before it (OpenAI's rule)."""
    calls = set()
    for i, m in enumerate(msgs):
        if m.role == "assistant":
            calls = {c.id for c in m.tool_calls or ()}
        elif m.role == "tool" and m.tool_call_id not in calls:
            raise ChatError(f"messages[{i}].tool_call_id: {m.tool_call_id!r} is not the id of a tool call of the "
                            "assistant message before it", f"messages[{i}].tool_call_id")
        elif m.role != "tool":
            calls = set()


@dataclass
class _Turn:
    """A message as the encoding sees it: tool results merged into user turns as blocks."""

    role: str
    content: str = ""
    blocks: list[tuple[str, int]] = field(default_factory=list)  # (text, rank); rank -1: a text block
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning: str = ""
    tools: list[dict] = field(default_factory=list)


def _turns(msgs: list[Message], tools: list[dict]) -> list[_Turn]:
    turns: list[_Turn] = []
    rank: dict[str, int] = {}  # tool_call_id -> its position among the calls of the assistant turn before
    for m in msgs:
        if m.role == "assistant":
            rank = {c.id: k for k, c in enumerate(m.tool_calls or ())}
        if m.role not in ("user", "tool"):
            role = "assistant" if m.role == "assistant" else "system"  # OpenAI's developer message is a system one
            turns.append(_Turn(role, m.content or "", tool_calls=list(m.tool_calls or ()),
                               reasoning=m.reasoning_content or ""))
            continue
        if not (turns and turns[-1].role == "user"):
            turns.append(_Turn("user"))
        turns[-1].blocks.append((f"<tool_result>{m.content}</tool_result>", rank[m.tool_call_id])
                                if m.role == "tool" else (m.content, -1))
    for t in turns:  # results in the order of the calls; text blocks stay where they were
        results = iter(sorted((b for b in t.blocks if b[1] >= 0), key=lambda b: b[1]))
        t.blocks = [next(results) if b[1] >= 0 else b for b in t.blocks]
    if tools:
        if not (turns and turns[0].role == "system"):
            turns.insert(0, _Turn("system"))
        turns[0].tools = tools
    return turns


def _last_user(turns: list[_Turn]) -> int:
    return max((i for i, t in enumerate(turns) if t.role == "user"), default=-1)


def _encode(msgs: list[Message], tools: list[dict], thinking: bool) -> str:
    turns = _turns(msgs, tools)
    drop = thinking and not tools  # with tools, reasoning stays across the whole tool loop
    last = _last_user(turns)
    out = []
    for i, t in enumerate(turns):
        out.append(_encode_turn(t, thinking and (not drop or i > last)))
        following = turns[i + 1].role if i + 1 < len(turns) else None
        if following in (None, "assistant") and t.role == "user":
            out.append(ASSISTANT + (THINK if thinking and (not drop or i >= last) else END_THINK))
    if turns[-1].role != "user":
        out.append(ASSISTANT + (THINK if thinking else END_THINK))  # ours: always a generation prompt
    return "".join(out)


def _encode_turn(t: _Turn, with_reasoning: bool) -> str:
    tools = "\n\n" + TOOLS_PROMPT.replace("{schemas}", "\n".join(_json(s) for s in t.tools)) if t.tools else ""
    if t.role == "system":
        return t.content + tools
    if t.role == "user":
        return USER + "\n\n".join(text for text, _ in t.blocks)
    reasoning = t.reasoning + END_THINK if with_reasoning else ""
    return reasoning + t.content + encode_tool_calls(t.tool_calls) + EOS


def encode_tool_calls(calls) -> str:
    """An assistant turn's tool calls as the model writes them ("" for none)."""
    if not calls:
        return ""
    invokes = []
    for c in calls:
        params = [f'<{DSML}parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
                  f'{v if isinstance(v, str) else _json(v)}</{DSML}parameter>'
                  for k, v in _arguments(c.function.arguments).items()]
        invokes.append(f'{INVOKE_OPEN} name="{c.function.name}">\n' + "\n".join(params) + f"\n{INVOKE_CLOSE}")
    return CALLS_LEAD + CALLS_OPEN + "\n" + "\n".join(invokes) + "\n" + CALLS_CLOSE


def _arguments(text: str) -> dict:
    # Arguments that are not a JSON object travel whole as one string parameter (the reference's way).
    try:
        value = json.loads(text)
    except ValueError:
        return {"arguments": text}
    return value if isinstance(value, dict) else {"arguments": text}


def _json(v) -> str:
    return json.dumps(v, ensure_ascii=False)


# ---- a checkpoint's own template ----------------------------------------------------------------

class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (HF's assistant-mask marker): renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise(message):
    raise jinja2.TemplateError(message)


@functools.lru_cache(maxsize=8)
def _compiled(template: str) -> jinja2.Template:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def _template_message(m: Message) -> dict:
    out = m.model_dump(exclude_unset=True)  # as the client sent it (a null content stays null, as in HF)
    for call in out.get("tool_calls", ()):  # templates index arguments as a mapping (HF, vLLM do this too)
        try:
            args = json.loads(call["function"]["arguments"])
        except ValueError:
            continue
        if isinstance(args, dict):
            call["function"]["arguments"] = args
    return out


def _render_template(template: str, msgs: list[Message], tools: list[Tool], thinking: bool, bos: str, eos: str,
                     kwargs: dict) -> str:
    variables = {"bos_token": bos, "eos_token": eos, "thinking": thinking, "enable_thinking": thinking, **kwargs}
    try:
        return _compiled(template).render(messages=[_template_message(m) for m in msgs],
                                          tools=[t.model_dump(exclude_none=True) for t in tools] or None,
                                          add_generation_prompt=True, **variables)
    except jinja2.TemplateError as e:
        raise ChatError(f"messages: the model's chat template refused them: {e}", "messages") from None


def template_for(tokenizer, tools: bool) -> str | None:
    """The tokenizer's chat template for a request (HF's choice: "tool_use" when there are tools)."""
    templates = tokenizer.chat_templates
    return templates.get("tool_use") if tools and "tool_use" in templates else templates.get("default")


def _token_text(tokenizer, token_id: int, default: str) -> str:
    return tokenizer.tok.id_to_token(token_id) or default


def prompt_ids(tokenizer, text: str) -> list[int]:
    """Token ids of a rendered prompt: a leading BOS text is the BOS id; nothing else is added."""
    bos = _token_text(tokenizer, tokenizer.bos_id, BOS)
    if text.startswith(bos):
        return [tokenizer.bos_id, *tokenizer.encode(text[len(bos):], add_bos=False)]
    return tokenizer.encode(text, add_bos=False)


@dataclass(frozen=True)
class ReplyFormat:
    """How to read the reply: it starts inside <think> (`reasoning`), tool calls are parsed (`tools`),
    the message carries reasoning_content (`thinking`)."""

    reasoning: bool = False
    tools: bool = False
    thinking: bool = False

    @property
    def markup(self) -> bool:
        """The reply's text is parsed: its markup must reach the parser even where the vocabulary
        makes <think>, </think> or DSML pieces special tokens (vLLM keeps them for tools too)."""
        return self.reasoning or self.tools or self.thinking


def prompt(tokenizer, messages, tools=None, tool_choice: str | None = None, template_kwargs: dict | None = None,
           thinking: Thinking | None = None, effort: str | None = None) -> tuple[list[int], ReplyFormat]:
    """A chat request's prompt ids and how to read its reply. Raises ChatError."""
    text, fmt = prompt_text(tokenizer, messages, tools, tool_choice, template_kwargs, thinking, effort)
    return prompt_ids(tokenizer, text), fmt


def prompt_text(tokenizer, messages, tools=None, tool_choice: str | None = None, template_kwargs: dict | None = None,
                thinking: Thinking | None = None, effort: str | None = None) -> tuple[str, ReplyFormat]:
    """A chat request's prompt text (`prompt_ids` tokenises it) and how to read its reply. tool_choice
    "none" leaves the tools out of the prompt (the model is not to call them). Raises ChatError."""
    tools = None if tool_choice == "none" else tools
    template = template_for(tokenizer, bool(tools))
    kwargs = template_kwargs or {}
    known = (*TEMPLATE_SWITCHES, "reasoning_effort")
    unused = sorted(set(kwargs) - set(known)) if template is None else []
    if unused:
        raise ChatError(f"chat_template_kwargs.{unused[0]}: this model has no chat template (DeepSeek-V4's "
                        f"encoding takes only {' / '.join(known)})", f"chat_template_kwargs.{unused[0]}")
    think, effort_max = thinking_switch(kwargs, thinking, effort)
    text = render(messages, tools, think, template, _token_text(tokenizer, tokenizer.bos_id, BOS),
                  _token_text(tokenizer, tokenizer.eos_id, EOS), kwargs, effort_max)
    # A template may open the reasoning with "<think>\n" (DeepSeek-R1's does): the reply starts inside it.
    return text, ReplyFormat(text.rstrip().endswith(THINK), bool(tools), think)


# ---- the reply: reasoning, content, tool calls --------------------------------------------------

@dataclass
class Delta:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict] = field(default_factory=list)  # complete calls, each with its index

    def __bool__(self):
        return bool(self.content or self.reasoning or self.tool_calls)


def _partial(text: str, marker: str) -> int:
    """The length of the longest end of `text` that could begin `marker` (text to hold back)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


_INVOKE = re.compile(rf'{INVOKE_OPEN}\s+name="([^"]+)"\s*>(.*){INVOKE_CLOSE}', re.DOTALL)
_PARAM = re.compile(rf'\s*<{DSML}parameter\s+name="([^"]+)"\s+string="(true|false)"\s*>(.*?)</{DSML}parameter>',
                    re.DOTALL)


def parse_invoke(text: str) -> tuple[str, str] | None:
    """(name, arguments as a JSON object string) of one whole <｜DSML｜invoke ...>...</｜DSML｜invoke>,
    or None when it is not well formed (a repeated parameter, stray text, ...)."""
    m = _INVOKE.fullmatch(text)
    if m is None:
        return None
    name, body = m.groups()
    args, pos = {}, 0
    while (p := _PARAM.match(body, pos)) is not None:
        key, is_string, value = p.groups()
        if key in args:
            return None
        args[key] = value if is_string == "true" else _json_value(value)
        pos = p.end()
    if body[pos:].strip():
        return None
    return name, _json(args)


def _json_value(text: str):
    # string="false" promises JSON; a value that is not stays the text it is rather than being lost.
    try:
        return json.loads(text)
    except ValueError:
        return text


class OutputParser:
    """Text deltas of one assistant turn in; content, reasoning and tool-call deltas out.

    `reasoning`: the prompt ended in <think> (the turn starts with its reasoning, up to </think>);
    otherwise a turn that begins with <think> starts reasoning too. `tools`: a
    <｜DSML｜tool_calls> block in the content is parsed into tool calls, one delta per invoke as
    soon as the invoke closes. Markup split across deltas is held back until it resolves; markup
    that turns out malformed is released as content (from the first text no tool call took), and
    at `finish` everything held is released, so no text is lost (only whitespace after a tool
    block is dropped).
    """

    def __init__(self, reasoning: bool = False, tools: bool = False):
        self.tools = tools
        self.mode = "reasoning" if reasoning else "start"
        self.buf = ""
        self.raw = ""  # text of the open tool block that no tool call has taken yet
        self.after_block = False  # whitespace right after a tool block is not content
        self.reasoned = reasoning
        self.tool_calls: list[dict] = []

    def feed(self, text: str) -> Delta:
        out = Delta()
        self.buf += text
        while getattr(self, "_" + self.mode)(out):
            pass
        return out

    def finish(self) -> Delta:
        """Release what is held back: the end of the turn settles it."""
        out = Delta()
        rest, self.buf = self.buf, ""
        if self.mode == "reasoning":
            out.reasoning += rest
        elif self.mode == "calls":
            rest, self.raw = self.raw + rest, ""
            out.content += rest if rest.strip() else ""
        elif not (self.after_block and not rest.strip()):
            out.content += rest
        return out

    # Each step consumes what it can and says whether another step could consume more.

    def _start(self, out: Delta) -> bool:
        if self.buf.startswith(THINK):
            self.buf, self.mode, self.reasoned = self.buf[len(THINK):], "reasoning", True
            return True
        if THINK.startswith(self.buf):
            return False
        self.mode = "content"
        return True

    def _reasoning(self, out: Delta) -> bool:
        i = self.buf.find(END_THINK)
        if i < 0:
            cut = len(self.buf) - _partial(self.buf, END_THINK)
            out.reasoning += self.buf[:cut]
            self.buf = self.buf[cut:]
            return False
        out.reasoning += self.buf[:i]
        self.buf, self.mode = self.buf[i + len(END_THINK):], "content"
        return True

    def _content(self, out: Delta) -> bool:
        if self.after_block:
            if not self.buf.strip():
                return False
            self.after_block = False
        if not self.tools:
            out.content += self.buf
            self.buf = ""
            return False
        i = self.buf.find(CALLS_OPEN)
        if i < 0:
            cut = len(self.buf) - max(_partial(self.buf, CALLS_LEAD + CALLS_OPEN), _partial(self.buf, CALLS_OPEN))
            out.content += self.buf[:cut]
            self.buf = self.buf[cut:]
            return False
        lead = CALLS_LEAD if self.buf[:i].endswith(CALLS_LEAD) else ""
        out.content += self.buf[:i - len(lead)]
        self.raw, self.buf, self.mode = lead + CALLS_OPEN, self.buf[i + len(CALLS_OPEN):], "calls"
        return True

    def _calls(self, out: Delta) -> bool:
        body = self.buf.lstrip()
        if body.startswith(CALLS_CLOSE):
            self.buf, self.raw, self.mode, self.after_block = body[len(CALLS_CLOSE):], "", "content", True
            return True
        if body.startswith(INVOKE_OPEN):
            end = body.find(INVOKE_CLOSE)
            if end < 0:
                return False
            invoke = body[:end + len(INVOKE_CLOSE)]
            call = parse_invoke(invoke)
            if call is not None:
                self._call(out, *call)
                self.buf, self.raw = body[len(invoke):], ""
                return True
        elif not body or CALLS_CLOSE.startswith(body) or INVOKE_OPEN.startswith(body):
            return False
        # Malformed: what no tool call took is content, and the rest of the turn is plain text.
        out.content += self.raw + self.buf
        self.buf, self.raw, self.mode, self.tools = "", "", "content", False
        return False

    def _call(self, out: Delta, name: str, arguments: str):
        call = {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                "function": {"name": name, "arguments": arguments}}
        self.tool_calls.append(call)
        out.tool_calls.append({"index": len(self.tool_calls) - 1, **call})


class ChatReply:
    """The assistant message of one chat completion, built from the text the model writes: deltas
    for a stream (`push`, `end`) and the whole message (`message`) with its finish_reason."""

    def __init__(self, fmt: ReplyFormat):
        self.parser = OutputParser(fmt.reasoning, fmt.tools)
        self.thinking = fmt.thinking
        self.content: list[str] = []
        self.reasoning: list[str] = []

    def push(self, text: str) -> dict | None:
        """The OpenAI `delta` this text releases (content, reasoning_content, tool_calls), or None."""
        return self._delta(self.parser.feed(text))

    def end(self) -> dict | None:
        """The delta of what was held back, once the turn ended."""
        return self._delta(self.parser.finish())

    def _delta(self, d: Delta) -> dict | None:
        self.content.append(d.content)
        self.reasoning.append(d.reasoning)
        out = {}
        if d.reasoning:
            out["reasoning_content"] = d.reasoning
        if d.content:
            out["content"] = d.content
        if d.tool_calls:
            out["tool_calls"] = d.tool_calls
        return out or None

    def finish_reason(self, finish: str) -> str:
        """"tool_calls" when the turn ended (not cut by length) after calling tools."""
        return "tool_calls" if finish == "stop" and self.parser.tool_calls else finish

    def message(self) -> dict:
        content = "".join(self.content)
        out = {"role": "assistant", "content": content or (None if self.parser.tool_calls else "")}
        if self.thinking or self.parser.reasoned:
            out["reasoning_content"] = "".join(self.reasoning)
        if self.parser.tool_calls:
            out["tool_calls"] = self.parser.tool_calls
        return out
