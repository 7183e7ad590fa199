"""The OpenAI completions and chat-completions protocol over a dsv4 model, without HTTP.

A request body is validated by pydantic models field by field (`RequestError` names the field
and its limit): every field of the OpenAI request types is either implemented or refused unless
it holds its neutral value, and a field OpenAI does not define is refused too, so nothing is
silently ignored. `parse` then tokenises the prompt (chat messages through DeepSeek's chat
encoding) and checks it against max_model_len. `TextStream` turns sampled tokens into text
deltas (whole characters, stop strings held back until they cannot match); `generate` runs it
over `Model.sample_tokens` for callers without a scheduler (`dsv4 chat`).
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any, Iterator

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from ..sampler import SamplingParams
from .chat import (ChatError, Messages, ReplyFormat, TemplateKwargs, Thinking, Tools, check_tool_choice, prompt,
                   render)

MAX_STOPS = 4


class RequestError(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.code, self.kind = message, param, status, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


# ---- field checks: each raises with the message the client sees ---------------------------------

def _refuse(message: str):
    # "{message}" as the template: the text itself may hold braces (a repr of a dict).
    raise PydanticCustomError("dsv4", "{message}", {"message": message})


def _number(lo: float, hi: float, integer: bool = False, hi_text: str | None = None):
    kind = int if integer else (int, float)
    what = "an integer" if integer else "a number"

    def check(v):
        if v is None:
            return v
        if isinstance(v, bool) or not isinstance(v, kind) or not lo <= v <= hi:
            _refuse(f"{what} in [{lo}, {hi_text or hi}], got {v!r}")
        return v
    return BeforeValidator(check)


def _seed(v):
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**64):
        _refuse(f"an integer in [0, 2**64), got {v!r}")
    return v


def _stop(v):
    stop = [v] if isinstance(v, str) else (v or [])
    if not (isinstance(stop, list) and len(stop) <= MAX_STOPS and all(isinstance(s, str) and s for s in stop)):
        _refuse(f"a non-empty string or a list of at most {MAX_STOPS}, got {v!r}")
    return stop


def _bool(v):
    if v is not None and not isinstance(v, bool):
        _refuse(f"true or false, got {v!r}")
    return v


Number = Annotated[Any, _number(0.0, 2.0)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: Annotated[bool | None, BeforeValidator(_bool)] = None
    include_obfuscation: Annotated[bool | None, BeforeValidator(_bool)] = None  # no obfuscation is sent


# Fields of the OpenAI request types (and vLLM's common extensions) that dsv4 does not implement,
# each with the values that mean "off" (None always does). Any other value is refused, naming it.
_NEUTRAL: dict[str, tuple] = {
    "n": (1,), "best_of": (1,), "echo": (False,), "suffix": ("",), "logprobs": (False,), "top_logprobs": (0,),
    "frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0), "repetition_penalty": (1, 1.0),
    "min_p": (0, 0.0), "logit_bias": ({},), "ignore_eos": (False,), "response_format": ({"type": "text"},),
    "functions": ([],), "function_call": ("none",),
    "parallel_tool_calls": (True, False), "audio": (), "modalities": (["text"],), "prediction": (),
    "reasoning_effort": (), "verbosity": (), "web_search_options": (), "store": (False,), "metadata": ({},),
    "service_tier": ("auto", "default"), "moderation": (), "prompt_cache_options": (),
    "prompt_cache_retention": (),
}
# Fields that only describe the caller (no effect on the output is their documented meaning).
_LABELS = ("user", "safety_identifier", "prompt_cache_key")


class _Body(BaseModel):
    """What both endpoints take; extra fields are refused (see `_NEUTRAL`)."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    max_tokens: Annotated[Any, _number(1, 2**31, integer=True, hi_text="max_model_len - prompt")] = None
    temperature: Number = None
    top_p: Annotated[Any, _number(1e-6, 1.0)] = None
    top_k: Annotated[Any, _number(-1, 2**31, integer=True, hi_text="vocab_size")] = None  # -1 or 0: off
    seed: Annotated[Any, BeforeValidator(_seed)] = None
    stop: Annotated[list[str], BeforeValidator(_stop)] = []
    stream: Annotated[bool | None, BeforeValidator(_bool)] = None
    stream_options: StreamOptions | None = None

    @model_validator(mode="before")
    @classmethod
    def _unimplemented(cls, body):
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        for name, v in body.items():
            if name in _NEUTRAL and v is not None and not any(_same(v, n) for n in _NEUTRAL[name]):
                allowed = " or ".join(repr(n) for n in _NEUTRAL[name]) or "null"
                raise RequestError(f"{name}: only {allowed} is supported by dsv4 serve, got {v!r}", name)
            if name in _LABELS and v is not None and not isinstance(v, str):
                raise RequestError(f"{name}: a string, got {v!r}", name)
        return {k: v for k, v in body.items() if k not in _NEUTRAL and k not in _LABELS}

    @model_validator(mode="after")
    def _stream_options_need_stream(self):
        if self.stream_options is not None and not self.stream:
            raise RequestError("stream_options: only with stream: true", "stream_options")
        return self


def _same(v, neutral) -> bool:
    return type(v) is type(neutral) and v == neutral or (isinstance(v, (int, float)) and not isinstance(v, bool)
                                                          and isinstance(neutral, (int, float)) and v == neutral)


class CompletionBody(_Body):
    prompt: Any = None


class ChatBody(_Body):
    messages: Messages
    max_completion_tokens: Annotated[Any, _number(1, 2**31, integer=True, hi_text="max_model_len - prompt")] = None
    tools: Tools = None
    tool_choice: Annotated[str | None, BeforeValidator(check_tool_choice)] = None
    chat_template_kwargs: TemplateKwargs = None  # the thinking switch (vLLM's), template variables
    thinking: Thinking | None = None  # the thinking switch (DeepSeek's API)


def _param(loc: tuple, prefix: str = "") -> str:
    out = prefix
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validation_error(e: ValidationError, prefix: str = "") -> RequestError:
    """The first of pydantic's errors, as one OpenAI-shaped error naming its field."""
    err = e.errors(include_url=False)[0]
    param = _param(err["loc"], prefix)
    if err["type"] == "dsv4":
        message = err["msg"]
    elif err["type"] == "extra_forbidden":
        message = "not a field of this endpoint (dsv4 serve refuses what it would otherwise ignore)"
    elif err["type"] == "missing":
        message = "required"
    else:
        message = f"{err['msg']}, got {err['input']!r}"
    return RequestError(f"{param}: {message}" if param else message, param or None)


def _validate(kind: type[BaseModel], body) -> BaseModel:
    # A RequestError raised inside a validator passes through pydantic as it is.
    try:
        return kind.model_validate(body)
    except ValidationError as e:
        raise validation_error(e) from None


def chat_text(messages) -> str:
    """DeepSeek's chat encoding (chat mode, no tools) of a list of messages, without BOS."""
    try:
        return render(messages, bos="")
    except ChatError as e:
        raise RequestError(e.message, e.param) from None


@dataclass
class Request:
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    chat: bool = False
    include_usage: bool = False
    reply: ReplyFormat = ReplyFormat()  # chat: how to read the reply (reasoning, tool calls)


def parse(body, model, max_model_len: int, chat: bool) -> Request:
    """Validate a request body and tokenise its prompt (slow for a long prompt: keep it off the engine)."""
    req = _validate(ChatBody if chat else CompletionBody, body)
    ids, reply = _chat_prompt(req, model) if chat else (_prompt_ids(req.prompt, model), ReplyFormat())
    room = max_model_len - len(ids)
    if room < 1:
        raise RequestError(f"prompt: {len(ids)} tokens leave no room under max_model_len {max_model_len}",
                           "prompt", code="context_length_exceeded")
    key = "max_completion_tokens" if chat and req.max_completion_tokens is not None else "max_tokens"
    max_tokens = getattr(req, key)
    if max_tokens is None:
        max_tokens = min(room, 256) if chat else min(room, 16)
    elif max_tokens > room:
        raise RequestError(f"{key}: an integer in [1, {room}] (max_model_len {max_model_len} - {len(ids)} prompt "
                           f"tokens), got {max_tokens}", key)
    top_k = req.top_k or 0
    if top_k > model.cfg.vocab_size:
        raise RequestError(f"top_k: an integer in [-1, {model.cfg.vocab_size}] (-1 or 0: off), got {top_k}", "top_k")
    seed = int.from_bytes(os.urandom(7), "little") if req.seed is None else req.seed
    temperature = 1.0 if req.temperature is None else float(req.temperature)
    top_p = 1.0 if req.top_p is None else float(req.top_p)
    sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=max(top_k, 0), seed=seed)
    usage = bool(req.stream_options and req.stream_options.include_usage)
    return Request(ids, max_tokens, sampling, req.stop, bool(req.stream), chat, usage, reply)


def _chat_prompt(req: ChatBody, model) -> tuple[list[int], ReplyFormat]:
    try:
        return prompt(model.tokenizer, req.messages, req.tools, req.tool_choice, req.chat_template_kwargs,
                           req.thinking)
    except ChatError as e:
        raise RequestError(e.message, e.param) from None


def _prompt_ids(prompt, model) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return model.tokenizer.encode(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        bad = [t for t in prompt if not 0 <= t < model.cfg.vocab_size]
        if bad:
            raise RequestError(f"prompt: token ids {bad[:4]} outside [0, {model.cfg.vocab_size})", "prompt")
        return list(prompt)
    raise RequestError("prompt: a string, or a list of token ids (one prompt per request)", "prompt")


class TextStream:
    """Tokens in, text deltas out: characters split across tokens come out whole, and a tail that
    could begin a stop string is held back until it cannot.

    Each token decodes a short window (the tokens since the last whole character, after one
    token of context), not the whole output: a long generation costs O(1) per token.
    """

    def __init__(self, tokenizer, eos_id: int, stop: list[str], skip_special: bool = True):
        self.tokenizer, self.eos_id, self.stop = tokenizer, eos_id, stop
        self.skip_special = skip_special  # False: special tokens (<think>, ... in some vocabularies) are text
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.out: list[int] = []
        self.text = ""  # the whole characters decoded so far
        self.prefix = self.read = 0  # out[prefix:read]: context already in text; out[read:]: not yet
        self.sent = 0  # characters of text released
        self.finish: str | None = None
        self.n = 0  # tokens sampled (an EOS counts; a token past a stop string does not exist)

    def push(self, token: int) -> str:
        """The text this token releases; sets `finish` to "stop" at EOS or a stop string."""
        self.n += 1
        if token == self.eos_id:
            self.finish = "stop"
            return self._rest()
        self.out.append(token)
        if not self._decode(final=False):
            return ""  # a character still being spelt out by the next token
        hits = [i for i in (self.text.find(s, max(0, self.sent - self.hold)) for s in self.stop) if i >= 0]
        if hits:
            self.finish = "stop"
            delta, self.sent = self.text[self.sent:max(self.sent, min(hits))], len(self.text)
            return delta
        safe = len(self.text) - self.hold
        if safe <= self.sent:
            return ""
        delta, self.sent = self.text[self.sent:safe], safe
        return delta

    def end(self, reason: str) -> str:
        """The held-back tail when generation ends for `reason` (length, ...)."""
        self.finish = reason
        return self._rest()

    def _decode(self, final: bool) -> bool:
        """Append the window's new whole characters to text (any at all when final)."""
        before = self.tokenizer.decode(self.out[self.prefix:self.read], self.skip_special)
        now = self.tokenizer.decode(self.out[self.prefix:], self.skip_special)
        if not final and (len(now) <= len(before) or now.endswith("\ufffd")):
            return False
        self.text += now[len(before):]
        self.prefix, self.read = self.read, len(self.out)
        return True

    def _rest(self) -> str:
        self._decode(final=True)
        delta, self.sent = self.text[self.sent:], len(self.text)
        return delta


def generate(model, req: Request) -> Iterator[tuple[str, str | None, int]]:
    """Yield (text delta, finish_reason or None, tokens sampled so far); the last has a finish_reason."""
    text = TextStream(model.tokenizer, model.cfg.eos_token_id, req.stop)
    for token in model.sample_tokens(req.prompt_ids, req.max_tokens, req.sampling):
        delta = text.push(token)
        if text.finish:
            yield delta, text.finish, text.n
            return
        if delta:
            yield delta, None, text.n
    yield text.end("length"), "length", text.n


def response_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def now() -> int:
    return int(time.time())
