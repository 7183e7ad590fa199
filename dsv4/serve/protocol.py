"""The OpenAI completions and chat-completions protocol over a dsv4 model, without HTTP.

A request body is validated by pydantic models field by field (`RequestError` names the field
and its limit): every field of the OpenAI request types is either implemented (`IMPLEMENTED`
says with what meaning) or refused unless it holds its neutral value (`_NEUTRAL`), and a field
OpenAI does not define is refused too, so nothing is silently ignored. `parse` then tokenises
the prompts (chat messages through chat.py: DeepSeek-V4's chat encoding or the checkpoint's
template), checks each against max_model_len and returns a `Call`: its prompts, the choices to
draw from them (one sequence each) and, for chat, how to read each reply (`Call.reply`: reasoning,
tool calls). `tokenize` and `detokenize` answer vLLM's /tokenize and /detokenize. `generate` runs
tokenizer.TextStream over `Model.sample_tokens` for callers without a scheduler (`dsv4 chat`).
"""

from __future__ import annotations

import functools
import json
import os
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Iterator

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from ..sampler import TOP_LOGPROBS, LogitsParams, SamplingParams
from ..tokenizer import TextStream
from .chat import (ChatError, Message, Messages, ReplyFormat, TemplateKwargs, Thinking, ToolChoice, Tools,
                   check_effort, check_messages, check_tool_choice, prompt_ids, prompt_text, render, tool_calls)

MAX_STOPS = 4
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's limit for completions' logprobs
# The device's logit processing (dsv4.sampler.process_logits) was GPU-checked in session 5 (benchmarks/
# sampling_check.py: solo == batched == graph) but for a grammar's mask (response_format, structured_outputs, the
# tool-call grammar), and the scored prefill (echo with logprobs, prompt_logprobs) has not run on a GPU: on CUDA
# both need DSV4_UNCHECKED_SAMPLING=1 (_unchecked_on_cuda; README: the GPU rule) until gpu_s51_serve_checks.sh passes.
SEED_SPACE = 2**64

# The request fields dsv4 serve honours, with their meaning here. With `_NEUTRAL` (refused unless off)
# this covers every field of the openai client's request types (tests/test_serve.py walks them).
IMPLEMENTED = {
    "model": "the served model (--served-model-name); another name is a 404",
    "prompt": "completions: a string, token ids, or a list of strings or of token-id lists (a batch)",
    "messages": "chat: system/developer, user, assistant (content null, tool_calls, reasoning_content) and tool "
                "turns, in DeepSeek-V4's chat encoding or the checkpoint's jinja chat template",
    "max_tokens": "tokens to sample at most per choice (default 16 for completions, 256 for chat)",
    "max_completion_tokens": "chat: max_tokens under its newer name (wins when both are given)",
    "n": "choices per prompt (all prompts' together at most --max-num-seqs); choice j of a prompt draws "
         "with seed (seed + j) mod 2**64, so choice 0 is the n=1 answer",
    "best_of": "completions: only equal to n (choices are not ranked)",
    "echo": "completions: each choice's text begins with its prompt's text; with logprobs, the logprobs begin with "
            "the prompt's tokens (the first null; each other its log-probability after the tokens before it, and "
            "the top logprobs), as OpenAI's legacy completions and lm-eval's loglikelihood requests read them",
    "temperature": "in [0, 2]; 0 is greedy",
    "top_p": "nucleus sampling, in (0, 1]",
    "top_k": "vLLM's: the k most likely tokens; -1 or 0 is off",
    "seed": "in [0, 2**64): the sampler draws are a function of (seed, position); random when absent",
    "stop": "up to 4 strings; the text ends before the first one found (finish_reason 'stop')",
    "stream": "server-sent events ending with data: [DONE]; each chunk names its choice index",
    "stream_options": "include_usage: a last chunk with the usage (none without it); include_obfuscation: "
                      "accepted, events carry no obfuscation padding",
    "ignore_eos": "vLLM's: keep sampling through EOS up to max_tokens",
    "stop_token_ids": "vLLM's: token ids that end the text when sampled (finish_reason 'stop'; the token's text kept, "
                      "unless it is a special token; stop_reason the id)",
    "min_tokens": "vLLM's, in [0, max_tokens]: EOS and stop_token_ids are kept out of the first min_tokens tokens "
                  "(a device-side mask) and stop strings do not end them",
    "include_stop_str_in_output": "vLLM's: the stop string that ends the text stays in it",
    "skip_special_tokens": "vLLM's, completions: false decodes special tokens as text (true, the default, drops "
                           "them); chat: only true (a reply's special tokens are its markup, parsed)",
    "allowed_token_ids": "vLLM's: every token is drawn from these ids alone (a device-side mask)",
    "bad_words": "vLLM's: words (each tokenised with and without a leading space) whose last token is kept out of "
                 "a step whose tokens so far end with the rest of the word (a device-side mask)",
    "return_token_ids": "vLLM's: each choice carries token_ids, the ids of the tokens it sampled (a stream sends a "
                        "chunk per token, its text possibly empty), and prompt_token_ids, its prompt's ids (in a "
                        "stream, on the choice's first chunk)",
    "presence_penalty": "in [-2, 2]: each logit minus the penalty when its token was generated already (OpenAI's)",
    "frequency_penalty": "in [-2, 2]: each logit minus the penalty times its token's count in the generated text "
                         "(OpenAI's)",
    "repetition_penalty": "vLLM's, > 0: a logit of a token of the prompt or the generated text divided by it "
                          "(positive) or multiplied by it (negative)",
    "logit_bias": "token id (a string) -> bias in [-100, 100], added to that token's logit",
    "min_p": "vLLM's, in [0, 1]: tokens less likely than min_p x the most likely (after temperature) are dropped",
    "logprobs": "chat: true for each token's log-probability (choices[].logprobs.content); completions: k in "
                "[0, 5], the chosen token's and the k most likely (tokens, token_logprobs, top_logprobs, "
                "text_offset). The distribution the token was drawn from: after penalties, logit_bias, a grammar, "
                "temperature, min_p, top-k and top-p, renormalised (vLLM's processed logprobs; a greedy request's at "
                "temperature 1); -9999.0 for a token outside it",
    "top_logprobs": "chat: in [0, 20], with logprobs: true: the most likely tokens at each position",
    "response_format": "text; json_object (any JSON object) or json_schema ({name, schema, strict}): the output is "
                       "constrained to it by xgrammar (compact JSON; pip install 'dsv4[json]')",
    "prompt_logprobs": "vLLM's, k in [0, 20]: the prompt's tokens scored, each choice's (chat: the response's) "
                       "prompt_logprobs [null, {token id: {logprob, rank, decoded_token}} of the prompt token and the "
                       "k most likely, ...]; not with stream, nor with echo and logprobs",
    "structured_outputs": "vLLM's: exactly one of json (a JSON schema), regex, choice (the output is one of the "
                          "strings), grammar (xgrammar's EBNF) or json_object (true), by xgrammar as response_format; "
                          "in thinking mode after the reasoning",
    "tools": "chat: functions (name, description, parameters, strict) shown in the prompt; the model's calls come "
             "back as tool_calls (finish_reason 'tool_calls'); strict: true holds a call's arguments to its "
             "parameters (a grammar, xgrammar's deepseek_v4 tag)",
    "tool_choice": "chat: 'auto' (the default), 'none' (the tools are left out of the prompt), 'required' (at "
                   "least one call), a named function (one call of it) or allowed_tools (the calls limited to "
                   "those, mode auto or required); the last three by a grammar over the DSML tool-call block",
    "parallel_tool_calls": "chat: true (the default) or false (at most one call, by the tool-call grammar)",
    "chat_template_kwargs": "chat: vLLM's; thinking / enable_thinking switch thinking mode (reasoning_content in "
                            "the reply); other keys are variables of the checkpoint's chat template",
    "reasoning_effort": "chat: 'none' (thinking off), 'high' (thinking on) or 'max' (vLLM's 'xhigh' too: thinking at "
                        "DeepSeek-V4's maximum effort, its encoder's effort prompt before the first message); "
                        "DeepSeek-V4 knows no other efforts",
    "thinking": "chat: DeepSeek's API switch {type: 'enabled' | 'disabled'} (reasoning_content in the reply)",
    "user": "a label of the caller; no effect on the output",
    "safety_identifier": "a label of the caller; no effect on the output",
    "prompt_cache_key": "a label of the caller; no effect on the output",
}

# Fields of the OpenAI request types (and vLLM's common extensions) that dsv4 does not implement,
# each with the values that mean "off" (None always does). Any other value is refused, naming it.
_NEUTRAL: dict[str, tuple] = {
    "suffix": ("",), "functions": ([],), "function_call": ("none",),
    "audio": (), "modalities": (["text"],), "prediction": (),
    "verbosity": (), "web_search_options": (), "store": (False,), "metadata": ({},),
    "service_tier": ("auto", "default"), "moderation": (), "prompt_cache_options": (),
    "prompt_cache_retention": (),
    "spaces_between_special_tokens": (True,),  # vLLM's; the tokenizer's decode puts no spaces between them anyway
}
_LABELS = ("user", "safety_identifier", "prompt_cache_key")


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
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < SEED_SPACE):
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


def _string(v):
    if v is not None and not isinstance(v, str):
        _refuse(f"a string, got {v!r}")
    return v


def _positive(v):
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1e6):
        _refuse(f"a number > 0, got {v!r}")
    return v


def _logit_bias(v):
    if v is None:
        return v
    if not isinstance(v, dict):
        _refuse(f"an object of token id -> bias, got {v!r}"[:200])
    out = {}
    for k, b in v.items():
        if not (isinstance(k, str) and k.isdigit()):
            _refuse(f"a key must be a token id (a string of digits), got {k!r}"[:200])
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not -100 <= b <= 100:
            _refuse(f"token {k}: a bias in [-100, 100], got {b!r}"[:200])
        out[int(k)] = float(b)
    return out


def _token_ids(v):
    """A list of token ids (integers >= 0; the vocabulary's bound is checked against the model in parse)."""
    if v is None:
        return v
    if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in v):
        _refuse(f"a list of token ids (integers >= 0), got {v!r}"[:200])
    return v


def _bad_words(v):
    if v is None:
        return v
    if not isinstance(v, list) or not all(isinstance(w, str) and w.strip() for w in v):
        _refuse(f"a list of words (non-empty strings), got {v!r}"[:200])
    return v


def _response_format(v):
    if v is None:
        return v
    kind = v.get("type") if isinstance(v, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        _refuse(f"an object with type 'text', 'json_object' or 'json_schema', got {v!r}"[:200])
    allowed = {"type", "json_schema"} if kind == "json_schema" else {"type"}
    if set(v) - allowed:
        _refuse(f"unknown keys {sorted(set(v) - allowed)} for type {kind!r}")
    if kind == "json_schema":
        spec = v.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            _refuse("json_schema: an object with a schema object ({name, schema, strict, description})")
        if set(spec) - {"name", "schema", "strict", "description"}:
            _refuse(f"json_schema: unknown keys {sorted(set(spec) - {'name', 'schema', 'strict', 'description'})}")
    return v


STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")  # vLLM's structured_outputs we serve


def _structured_outputs(v):
    """vLLM's structured_outputs: exactly one of json (a schema), regex, choice (strings), grammar (xgrammar's EBNF)
    or json_object (true). Its other keys (whitespace_pattern, structural_tag, disable_* ...) are refused."""
    if v is None:
        return v
    if not isinstance(v, dict):
        _refuse(f"an object with one of {list(STRUCTURED_KINDS)}, got {v!r}"[:200])
    unknown = sorted(set(v) - set(STRUCTURED_KINDS))
    if unknown:
        _refuse(f"{unknown[0]}: not supported by dsv4 serve (it serves {', '.join(STRUCTURED_KINDS)})")
    given = [k for k in STRUCTURED_KINDS if v.get(k) is not None]
    if len(given) != 1:
        _refuse(f"exactly one of {list(STRUCTURED_KINDS)}, got {given or 'none'}")
    kind, value = given[0], v[given[0]]
    if kind == "json" and isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            _refuse(f"json: a JSON schema (an object, or its JSON text), got {value!r}"[:200])
    ok = {"json": lambda x: isinstance(x, (dict, bool)), "regex": lambda x: isinstance(x, str) and x != "",
          "grammar": lambda x: isinstance(x, str) and x.strip() != "", "json_object": lambda x: x is True,
          "choice": lambda x: isinstance(x, list) and x and all(isinstance(c, str) and c for c in x)}[kind]
    if not ok(value):
        what = {"json": "a JSON schema", "regex": "a non-empty regular expression", "grammar": "an EBNF grammar",
                "json_object": "true", "choice": "a non-empty list of non-empty strings"}[kind]
        _refuse(f"{kind}: {what}, got {value!r}"[:200])
    return {kind: value}


Number = Annotated[Any, _number(0.0, 2.0)]
Penalty = Annotated[Any, _number(-2.0, 2.0)]
Flag = Annotated[bool | None, BeforeValidator(_bool)]
Count = Annotated[Any, _number(1, 2**31, integer=True, hi_text="max_model_len - prompt")]


def _object(body):
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _optional_messages(v):
    return v if v is None else check_messages(v)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: Flag = None
    include_obfuscation: Flag = None  # no obfuscation is sent


class _Body(BaseModel):
    """What both endpoints take; extra fields are refused (see `_NEUTRAL`)."""

    model_config = ConfigDict(extra="forbid")
    model: Annotated[str | None, BeforeValidator(_string)] = None
    max_tokens: Count = None
    n: Annotated[Any, _number(1, 2**31, integer=True, hi_text="--max-num-seqs")] = None
    temperature: Number = None
    top_p: Annotated[Any, _number(1e-6, 1.0)] = None
    top_k: Annotated[Any, _number(-1, 2**31, integer=True, hi_text="vocab_size")] = None  # -1 or 0: off
    seed: Annotated[Any, BeforeValidator(_seed)] = None
    stop: Annotated[list[str], BeforeValidator(_stop)] = []
    stream: Flag = None
    stream_options: StreamOptions | None = None
    ignore_eos: Flag = None
    stop_token_ids: Annotated[Any, BeforeValidator(_token_ids)] = None
    min_tokens: Annotated[Any, _number(0, 2**31, integer=True, hi_text="max_tokens")] = None
    include_stop_str_in_output: Flag = None
    skip_special_tokens: Flag = None
    allowed_token_ids: Annotated[Any, BeforeValidator(_token_ids)] = None
    bad_words: Annotated[Any, BeforeValidator(_bad_words)] = None
    return_token_ids: Flag = None
    presence_penalty: Penalty = None
    frequency_penalty: Penalty = None
    repetition_penalty: Annotated[Any, BeforeValidator(_positive)] = None
    min_p: Annotated[Any, _number(0.0, 1.0)] = None
    logit_bias: Annotated[Any, BeforeValidator(_logit_bias)] = None
    response_format: Annotated[Any, BeforeValidator(_response_format)] = None
    structured_outputs: Annotated[Any, BeforeValidator(_structured_outputs)] = None
    prompt_logprobs: Annotated[Any, _number(0, TOP_LOGPROBS, integer=True)] = None

    @model_validator(mode="before")
    @classmethod
    def _unimplemented(cls, body):
        for name, v in _object(body).items():
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
    if isinstance(v, bool) or isinstance(neutral, bool):  # logprobs: 0 is not false (it asks for logprobs)
        return v is neutral
    if isinstance(v, (int, float)) and isinstance(neutral, (int, float)):
        return v == neutral
    return type(v) is type(neutral) and v == neutral


class CompletionBody(_Body):
    prompt: Any = None
    echo: Flag = None
    best_of: Annotated[Any, _number(1, 2**31, integer=True, hi_text="--max-num-seqs")] = None
    logprobs: Annotated[Any, _number(0, MAX_COMPLETION_LOGPROBS, integer=True)] = None

    @model_validator(mode="after")
    def _best_of_is_n(self):
        if self.best_of is not None and self.best_of != (self.n or 1):
            raise RequestError(f"best_of: only equal to n ({self.n or 1}) is supported by dsv4 serve (choices are "
                               f"not ranked), got {self.best_of}", "best_of")
        return self


class ChatBody(_Body):
    messages: Messages
    max_completion_tokens: Count = None
    tools: Tools = None
    tool_choice: Annotated[ToolChoice | None, BeforeValidator(check_tool_choice)] = None
    parallel_tool_calls: Flag = None
    chat_template_kwargs: TemplateKwargs = None  # the thinking switch (vLLM's), template variables
    thinking: Thinking | None = None  # the thinking switch (DeepSeek's API)
    reasoning_effort: Annotated[str | None, BeforeValidator(check_effort)] = None
    logprobs: Flag = None
    top_logprobs: Annotated[Any, _number(0, TOP_LOGPROBS, integer=True)] = None

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise RequestError("top_logprobs: only with logprobs: true", "top_logprobs")
        return self


class TokenizeBody(BaseModel):
    """vLLM's /tokenize: a prompt, or chat messages with their tools and chat_template_kwargs
    (tokenised as the chat endpoint would run them)."""

    model_config = ConfigDict(extra="forbid")
    model: Annotated[str | None, BeforeValidator(_string)] = None
    prompt: Annotated[str | None, BeforeValidator(_string)] = None
    messages: Annotated[list[Message] | None, BeforeValidator(_optional_messages)] = None
    tools: Tools = None
    chat_template_kwargs: TemplateKwargs = None
    add_special_tokens: Flag = None
    add_generation_prompt: Flag = None
    return_token_strs: Flag = None

    @model_validator(mode="before")
    @classmethod
    def _json_object(cls, body):
        return _object(body)

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise RequestError("prompt or messages: exactly one of them", "prompt")
        for name in ("tools", "chat_template_kwargs"):
            if self.prompt is not None and getattr(self, name) is not None:
                raise RequestError(f"{name}: only with messages", name)
        if self.messages is not None and self.add_special_tokens:
            raise RequestError("add_special_tokens: only false with messages (the chat encoding begins with BOS "
                               "already)", "add_special_tokens")
        if self.add_generation_prompt is False:
            raise RequestError("add_generation_prompt: only true is supported by dsv4 serve (the chat encoding "
                               "ends with the assistant's opening)", "add_generation_prompt")
        if self.prompt is not None and self.add_generation_prompt is not None:
            raise RequestError("add_generation_prompt: only with messages", "add_generation_prompt")
        return self


def _token_ids(v):
    if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in v):
        _refuse(f"a list of token ids, got {v!r}"[:200])
    return v


class DetokenizeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: Annotated[str | None, BeforeValidator(_string)] = None
    tokens: Annotated[list[int], BeforeValidator(_token_ids)]

    @model_validator(mode="before")
    @classmethod
    def _json_object(cls, body):
        return _object(body)


def _param(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validation_error(e: ValidationError) -> RequestError:
    """The first of pydantic's errors, as one OpenAI-shaped error naming its field."""
    err = e.errors(include_url=False)[0]
    param = _param(err["loc"])
    if err["type"] == "dsv4":
        message = err["msg"]
    elif err["type"] == "extra_forbidden":
        message = "not a field of this endpoint (dsv4 serve refuses what it would otherwise ignore)"
    elif err["type"] == "missing":
        message = "required"
    else:
        message = f"{err['msg']}, got {err['input']!r}"[:300]
    return RequestError(f"{param}: {message}" if param else message, param or None)


def _validate(kind: type[BaseModel], body) -> BaseModel:
    # A RequestError raised inside a validator passes through pydantic as it is.
    try:
        return kind.model_validate(body)
    except ValidationError as e:
        raise validation_error(e) from None


def chat_text(messages) -> str:
    """DeepSeek-V4's chat encoding (chat mode, no tools) of a list of messages (dicts or `Message`s),
    without BOS; a developer message is a system message (OpenAI's newer name for it)."""
    try:
        return render(messages, bos="")
    except ChatError as e:
        raise RequestError(e.message, e.param) from None


# ---- requests -------------------------------------------------------------------------------------

@dataclass
class Request:
    """One sequence to sample without a scheduler (`generate`)."""
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: list[str] = field(default_factory=list)
    skip_special: bool = True  # False: special tokens decode as text (a parsed chat reply's markup)


@dataclass
class Prompt:
    ids: list[int]
    max_tokens: int
    echo: str = ""  # the text before each of its choices' text ("" without echo)


@dataclass
class Choice:
    index: int  # OpenAI's: prompt i's choice j is i * n + j
    prompt: Prompt
    sampling: SamplingParams


@dataclass(frozen=True)
class TextRules:
    """vLLM's extras of a request's text and stops: stop_token_ids, min_tokens (with the mask that keeps EOS and the
    stop ids out of the first ones), include_stop_str_in_output, skip_special_tokens, allowed_token_ids."""
    stop_ids: tuple[int, ...] = ()
    min_tokens: int = 0
    keep_stop: bool = False
    skip_special: bool = True
    allowed: tuple[int, ...] | None = None
    bad_words: tuple[tuple[int, ...], ...] = ()  # bad_words' token sequences (grammar.BadWords)


@dataclass
class Call:
    """One validated API request: its prompts (one for chat) and how to answer."""
    prompts: list[Prompt]
    n: int
    sampling: SamplingParams  # choice j of each prompt draws with seed (seed + j) mod 2**64
    stop: list[str]
    stream: bool
    chat: bool
    include_usage: bool
    ignore_eos: bool
    reply: ReplyFormat = ReplyFormat()  # chat: how to read each choice's reply (reasoning, tool calls)
    logits: LogitsParams | None = None  # the device's logit processing and logprobs; None: the plain sampler
    grammar: object = None  # response_format's or the tool calls' compiled grammar (dsv4.serve.grammar): a matcher
    # per choice
    token_ids: bool = False  # return_token_ids: the choices carry their sampled (and prompt) token ids
    prompt_logprobs: int | None = None  # the prompt's tokens scored, with this many top ones, for `prompt_shape`:
    prompt_shape: str | None = None  # "echo" (echo with logprobs: OpenAI's) or "vllm" (prompt_logprobs)
    text: TextRules = field(default_factory=TextRules)  # vLLM's stop ids, min_tokens, kept stops, specials

    def choices(self) -> list[Choice]:
        return [Choice(i * self.n + j, prompt, replace(self.sampling, seed=(self.sampling.seed + j) % SEED_SPACE))
                for i, prompt in enumerate(self.prompts) for j in range(self.n)]


def parse(body, model, max_model_len: int, chat: bool, max_choices: int) -> Call:
    """Validate a request body and tokenise its prompts (slow for a long prompt: keep it off the event loop)."""
    req = _validate(ChatBody if chat else CompletionBody, body)
    logits = _logits(req, chat, model)
    reply, calls = ReplyFormat(), None
    formats = [name for name in ("response_format", "structured_outputs") if _asks(req, name)]
    if len(formats) > 1:
        raise RequestError("structured_outputs: not with response_format (one grammar a reply)", "structured_outputs")
    if chat:
        calls = _tool_calls(req, formats)
        _unchecked_on_cuda(model, formats[0] if formats else calls and calls.asked_by, GRAMMAR)
        ids, reply = _chat_prompt(req.messages, req.tools, req.tool_choice, req.chat_template_kwargs, req.thinking,
                                  model.tokenizer, max_model_len, req.reasoning_effort)
        inputs = [(ids, "")]
    else:
        _unchecked_on_cuda(model, formats[0] if formats else None, GRAMMAR)
        inputs = _completion_prompts(req.prompt, model, max_model_len)
    grammar = _grammar(req, calls, reply, model)
    n = req.n or 1
    if n * len(inputs) > max_choices:
        many = f"{n} x {len(inputs)} prompts = {n * len(inputs)}" if len(inputs) > 1 else f"{n}"
        raise RequestError(f"n: {many} choices; this server samples at most {max_choices} sequences at once "
                           f"(--max-num-seqs)", "n")
    key = "max_completion_tokens" if chat and req.max_completion_tokens is not None else "max_tokens"
    echo = not chat and req.echo
    prompts = [_prompt(ids, text if echo else "", getattr(req, key), key, chat, max_model_len, param)
               for (ids, text), param in zip(inputs, _prompt_params(len(inputs), chat))]
    top_k = req.top_k or 0
    if top_k > model.cfg.vocab_size:
        raise RequestError(f"top_k: an integer in [-1, {model.cfg.vocab_size}] (-1 or 0: off), got {top_k}", "top_k")
    seed = int.from_bytes(os.urandom(7), "little") if req.seed is None else req.seed
    temperature = 1.0 if req.temperature is None else float(req.temperature)
    top_p = 1.0 if req.top_p is None else float(req.top_p)
    sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=max(top_k, 0), seed=seed)
    usage = bool(req.stream_options and req.stream_options.include_usage)
    scored, shape, asked = None, None, None
    if echo and req.logprobs is not None:
        scored, shape, asked = req.logprobs, "echo", "echo"
    if req.prompt_logprobs is not None:
        if shape is not None or req.stream:
            raise RequestError(f"prompt_logprobs: not with {'stream' if req.stream else 'echo and logprobs'} "
                               "(one shape of the prompt's logprobs, in a whole response)", "prompt_logprobs")
        scored, shape, asked = req.prompt_logprobs, "vllm", "prompt_logprobs"
    _unchecked_on_cuda(model, asked, "the scored prefill, Model.prefill_scored, is")
    text = _text_rules(req, chat, model, prompts)
    return Call(prompts, n, sampling, req.stop, bool(req.stream), chat, usage, bool(req.ignore_eos), reply, logits,
                grammar, bool(req.return_token_ids), scored, shape, text)


def _text_rules(req, chat: bool, model, prompts: list[Prompt]) -> TextRules:
    """vLLM's extras, checked against the model's vocabulary and the request's max_tokens."""
    vocab = model.cfg.vocab_size
    for name in ("stop_token_ids", "allowed_token_ids"):
        ids = getattr(req, name)
        bad = [t for t in ids or () if t >= vocab]
        if bad:
            raise RequestError(f"{name}: token ids {bad[:4]} outside [0, {vocab})", name)
    if req.allowed_token_ids is not None and not req.allowed_token_ids:
        raise RequestError("allowed_token_ids: at least one token id (an empty list allows nothing)",
                           "allowed_token_ids")
    least = min(p.max_tokens for p in prompts)
    if (req.min_tokens or 0) > least:
        raise RequestError(f"min_tokens: at most max_tokens ({least}), got {req.min_tokens}", "min_tokens")
    if chat and req.skip_special_tokens is False:
        raise RequestError("skip_special_tokens: only true in chat (a reply's special tokens are its markup, parsed "
                           "into reasoning_content and tool_calls); completions take false", "skip_special_tokens")
    # the first min_tokens tokens and allowed_token_ids are drawn under a device-side mask, the grammar's path
    _unchecked_on_cuda(model, "min_tokens" if req.min_tokens else None, GRAMMAR)
    _unchecked_on_cuda(model, "allowed_token_ids" if req.allowed_token_ids else None, GRAMMAR)
    _unchecked_on_cuda(model, "bad_words" if req.bad_words else None, GRAMMAR)
    return TextRules(tuple(dict.fromkeys(req.stop_token_ids or ())), req.min_tokens or 0,
                     bool(req.include_stop_str_in_output), req.skip_special_tokens is not False,
                     None if req.allowed_token_ids is None else tuple(sorted(set(req.allowed_token_ids))),
                     _bad_word_ids(req.bad_words or (), model.tokenizer))


def _bad_word_ids(words, tokenizer) -> tuple[tuple[int, ...], ...]:
    """Each word's tokens as vLLM takes them: the word (its leading spaces dropped), and with one leading space where
    that is a different first token and as many tokens (a word in the middle of a text)."""
    out = []
    for word in words:
        bare = tuple(tokenizer.encode(word.lstrip(), add_bos=False))
        spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_bos=False))
        out.append(bare)
        if spaced and spaced[0] != bare[0] and len(spaced) == len(bare):
            out.append(spaced)
    return tuple(dict.fromkeys(out))


def _asks(req, name: str) -> bool:
    """Whether the request's field `name` (a sampler field) is on."""
    v = getattr(req, name, None)
    if v is None or v is False:
        return False
    if name == "logprobs":  # true (chat), or any k (completions: 0 asks for the chosen token's)
        return True
    return v != {"repetition_penalty": 1, "logit_bias": {}, "response_format": {"type": "text"}}.get(name, 0)


GRAMMAR = "its device-side grammar mask is"


def _unchecked_on_cuda(model, asked_by: str | None, what: str):
    """What the field `asked_by` asks for runs device code no GPU run has checked (`what`): refused on CUDA unless
    DSV4_UNCHECKED_SAMPLING=1."""
    if asked_by and model.device.type == "cuda" and os.environ.get("DSV4_UNCHECKED_SAMPLING") != "1":
        raise RequestError(f"{asked_by}: not yet available on CUDA ({what} not yet GPU-checked; "
                           "DSV4_UNCHECKED_SAMPLING=1 serves it unchecked)", asked_by)


def _tool_calls(req, formats: list[str]):
    try:
        calls = tool_calls(req.tools, req.tool_choice, req.parallel_tool_calls)
    except ChatError as e:
        raise RequestError(e.message, e.param) from None
    if calls is not None and formats:
        raise RequestError(f"{formats[0]}: not with {calls.asked_by} (one grammar a reply: the tool calls' or the "
                           "output format's)", formats[0])
    return calls


def _logits(req, chat: bool, model) -> LogitsParams | None:
    """The request's logit processing and logprobs (None: neither)."""
    bias = req.logit_bias or {}
    bad = [t for t in bias if t >= model.cfg.vocab_size]
    if bad:
        raise RequestError(f"logit_bias: token ids {bad[:4]} outside [0, {model.cfg.vocab_size})", "logit_bias")
    k = (req.top_logprobs or 0 if req.logprobs else None) if chat else req.logprobs
    params = LogitsParams(presence_penalty=req.presence_penalty or 0.0, frequency_penalty=req.frequency_penalty or 0.0,
                          repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
                          min_p=req.min_p or 0.0, logit_bias=bias, logprobs=k)
    return params if params.processes or k is not None else None


def _grammar(req, calls, reply: ReplyFormat, model):
    """The reply's compiled grammar: the tool calls', response_format's JSON or structured_outputs' (after the
    reasoning of a reply that starts inside <think>), or None."""
    structured = req.structured_outputs
    if calls is None and structured is None and not _asks(req, "response_format"):
        return None
    from . import grammar  # xgrammar is an optional dependency

    try:
        if calls is not None:
            return grammar.compile_tool_calls(calls, model, reply.reasoning)
        if structured is not None:
            return grammar.compile_structured(structured, model, reply.reasoning)
        return grammar.compile_format(req.response_format, model, reply.reasoning)
    except grammar.FormatError as e:
        raise RequestError(e.message, e.param) from None


def _chat_prompt(messages, tools, tool_choice, template_kwargs, thinking, tokenizer,
                 max_model_len: int | None, effort: str | None = None) -> tuple[list[int], ReplyFormat]:
    """A chat request's prompt ids (checked by its bytes before tokenising) and how to read its reply."""
    try:
        text, reply = prompt_text(tokenizer, messages, tools, tool_choice, template_kwargs, thinking, effort)
    except ChatError as e:
        raise RequestError(e.message, e.param) from None
    _check_bytes(text, tokenizer, max_model_len, "messages")
    return prompt_ids(tokenizer, text), reply


def _prompt_params(count: int, chat: bool) -> list[str]:
    if chat:
        return ["messages"]
    return ["prompt"] if count == 1 else [f"prompt[{i}]" for i in range(count)]


def _prompt(ids: list[int], echo: str, max_tokens, key: str, chat: bool, max_model_len: int, param: str) -> Prompt:
    room = max_model_len - len(ids)
    if room < 1:
        raise RequestError(f"{param}: {len(ids)} tokens leave no room under max_model_len {max_model_len}",
                           param, code="context_length_exceeded")
    if max_tokens is None:
        max_tokens = min(room, 256) if chat else min(room, 16)
    elif max_tokens > room:
        raise RequestError(f"{key}: an integer in [1, {room}] (max_model_len {max_model_len} - {len(ids)} tokens "
                           f"of {param}), got {max_tokens}", key)
    return Prompt(ids, max_tokens, echo)


def _is_ids(v) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(t, int) and not isinstance(t, bool) for t in v)


def _completion_prompts(prompt, model, max_model_len: int) -> list[tuple[list[int], str]]:
    """(token ids, text) of each prompt: one for a string or a list of ids, one per item of a batch."""
    if isinstance(prompt, str) or _is_ids(prompt):
        batch, params = [prompt], ["prompt"]
    elif isinstance(prompt, list) and prompt and (all(isinstance(p, str) for p in prompt)
                                                   or all(_is_ids(p) for p in prompt)):
        batch, params = prompt, [f"prompt[{i}]" for i in range(len(prompt))]
    else:
        raise RequestError("prompt: a string, a non-empty list of token ids, or a non-empty list of strings or of "
                           f"token-id lists, got {prompt!r}"[:300], "prompt")
    out = []
    for p, param in zip(batch, params):
        if isinstance(p, str):
            out.append((_encode(p, model.tokenizer, max_model_len, param), p))
            continue
        bad = [t for t in p if not 0 <= t < model.cfg.vocab_size]
        if bad:
            raise RequestError(f"{param}: token ids {bad[:4]} outside [0, {model.cfg.vocab_size})", param)
        out.append((list(p), model.tokenizer.decode(p)))
    return out


def _encode(text: str, tokenizer, max_model_len: int | None, param: str) -> list[int]:
    """The prompt's token ids, BOS first."""
    _check_bytes(text, tokenizer, max_model_len, param)
    return tokenizer.encode(text)


def _check_bytes(text: str, tokenizer, max_model_len: int | None, param: str):
    """Refuse a text too long for max_model_len by its bytes alone, before tokenising it (megabytes take
    seconds); a lone surrogate too."""
    size = _utf8_size(text, param)
    if max_model_len is not None and size >= max_model_len:
        longest = _longest_token_bytes(tokenizer)
        # Each token spells at most `longest` bytes; twice that allows for decoders that drop a space.
        least = size // (2 * longest) if longest else 0
        if least >= max_model_len:
            raise RequestError(f"{param}: at least {least} tokens ({size} bytes) leave no room under max_model_len "
                               f"{max_model_len}", param, code="context_length_exceeded")


def _utf8_size(text: str, param: str) -> int:
    try:
        return len(text.encode())
    except UnicodeEncodeError as e:  # a lone surrogate ("\ud800" in the JSON)
        raise RequestError(f"{param}: not valid Unicode (a lone surrogate at character {e.start})", param) from None


@functools.lru_cache(maxsize=4)
def _longest_token_bytes(tokenizer) -> int | None:
    """The most UTF-8 bytes one token decodes to; None when a normalizer may shrink text (no bound)."""
    hf = getattr(tokenizer, "tok", None)
    if hf is None or json.loads(hf.to_str()).get("normalizer") not in (None, {"type": "Sequence", "normalizers": []}):
        return None
    size = hf.get_vocab_size(with_added_tokens=True)
    pieces = hf.decode_batch([[i] for i in range(size)], skip_special_tokens=False)
    return max(len(p.encode(errors="replace")) for p in pieces) or None


def tokenize(body, model, max_model_len: int) -> dict:
    """vLLM's /tokenize: the ids the completions (prompt) or chat (messages) endpoint would prefill."""
    req = _validate(TokenizeBody, body)
    if req.messages is not None:
        ids, _ = _chat_prompt(req.messages, req.tools, None, req.chat_template_kwargs, None, model.tokenizer, None)
    else:
        _utf8_size(req.prompt, "prompt")
        ids = model.tokenizer.encode(req.prompt, add_bos=req.add_special_tokens is not False)
    strs = [model.tokenizer.tok.id_to_token(i) for i in ids] if req.return_token_strs else None
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": strs}


def chat_prompt_ids(body, model) -> list[int]:
    """The prompt ids of a chat request as the chat endpoint would prefill them (its thinking switch and effort
    included), whatever its length: a count, not a request to serve (Anthropic's count_tokens)."""
    req = _validate(ChatBody, body)
    ids, _ = _chat_prompt(req.messages, req.tools, req.tool_choice, req.chat_template_kwargs, req.thinking,
                          model.tokenizer, None, req.reasoning_effort)
    return ids


def detokenize(body, model) -> dict:
    """vLLM's /detokenize: the text of token ids, special tokens spelt out."""
    req = _validate(DetokenizeBody, body)
    bad = [t for t in req.tokens if not 0 <= t < model.cfg.vocab_size]
    if bad:
        raise RequestError(f"tokens: token ids {bad[:4]} outside [0, {model.cfg.vocab_size})", "tokens")
    return {"prompt": model.tokenizer.decode(req.tokens, skip_special_tokens=False)}


def model_name(body) -> str | None:
    """The body's model field when it is a string (its type is checked with the rest)."""
    name = body.get("model") if isinstance(body, dict) else None
    return name if isinstance(name, str) else None


def generate(model, req: Request, progress: bool = False,
             tokens: Iterator[int] | None = None) -> Iterator[tuple[str, str | None, int]]:
    """Yield (text delta, finish_reason or None, tokens sampled so far); the last has a finish_reason.
    `progress`: a bar over a long prompt's prefill on a terminal (dsv4.generation.prefill). tokens: the request's
    sampled tokens from elsewhere (dsv4.speculative.sample_tokens: the same ones)."""
    text = TextStream(model.tokenizer, model.cfg.eos_token_id, req.stop, skip_special=req.skip_special)
    if tokens is None:
        tokens = model.sample_tokens(req.prompt_ids, req.max_tokens, req.sampling, progress=progress)
    for token in tokens:
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
