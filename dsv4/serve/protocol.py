"""The OpenAI completions and chat-completions protocol over a dsv4 model, without HTTP.

A request body is validated field by field (`RequestError` names the field and
its limit), the prompt is tokenised (chat messages through DeepSeek's chat
encoding), and `generate` yields text deltas as tokens are sampled: the device
sampler keyed by (seed, position), so a request with a seed is reproducible
and streaming and non-streaming give the same text.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Iterator

from ..sampler import SamplingParams

# DeepSeek's chat encoding (V3.2 style, non-thinking): the system text, then
# <｜User｜>text and <｜Assistant｜></think>text<｜end▁of▁sentence｜> turns, then the
# assistant's opening. BOS comes from the tokenizer.
USER, ASSISTANT, END_THINK, EOS_TEXT = "<｜User｜>", "<｜Assistant｜>", "</think>", "<｜end▁of▁sentence｜>"
MAX_STOPS = 4


class RequestError(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": "invalid_request_error", "param": self.param,
                          "code": self.code}}


def _number(body: dict, name: str, default, lo: float, hi: float, integer: bool = False):
    v = body.get(name, default)
    if v is None:
        v = default
    kind = int if integer else (int, float)
    if isinstance(v, bool) or not isinstance(v, kind) or not lo <= v <= hi:
        what = "an integer" if integer else "a number"
        raise RequestError(f"{name}: {what} in [{lo}, {hi}], got {v!r}", name)
    return v


@dataclass
class Request:
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    chat: bool = False


def chat_text(messages) -> str:
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: a non-empty list of {role, content}", "messages")
    system, turns = [], []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise RequestError(f"messages[{i}].role: 'system', 'user' or 'assistant'", f"messages[{i}].role")
        content = m.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise RequestError(f"messages[{i}].content: text parts only", f"messages[{i}].content")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content: a string", f"messages[{i}].content")
        if m["role"] == "system":
            if turns:
                raise RequestError(f"messages[{i}]: system messages come first", f"messages[{i}].role")
            system.append(content)
        elif m["role"] == "user":
            turns.append(USER + content)
        else:
            turns.append(ASSISTANT + END_THINK + content + EOS_TEXT)
    return "\n\n".join(system) + "".join(turns) + ASSISTANT + END_THINK


def parse(body, model, max_model_len: int, chat: bool) -> Request:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    if chat:
        ids = model.tokenizer.encode(chat_text(body.get("messages")))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = model.tokenizer.encode(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                          for t in prompt):
            bad = [t for t in prompt if not 0 <= t < model.cfg.vocab_size]
            if bad:
                raise RequestError(f"prompt: token ids {bad[:4]} outside [0, {model.cfg.vocab_size})", "prompt")
            ids = list(prompt)
        else:
            raise RequestError("prompt: a string, or a list of token ids (one prompt per request)", "prompt")
    if body.get("n", 1) != 1:
        raise RequestError("n: only 1 is supported", "n")
    for unsupported in ("logprobs", "echo", "best_of", "tools", "suffix"):
        if body.get(unsupported) not in (None, False, 1 if unsupported == "best_of" else None):
            raise RequestError(f"{unsupported}: not supported by dsv4 serve", unsupported)
    room = max_model_len - len(ids)
    if room < 1:
        raise RequestError(f"prompt: {len(ids)} tokens leave no room under max_model_len {max_model_len}",
                           "prompt", code="context_length_exceeded")
    key = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    max_tokens = _number(body, key, min(room, 256) if chat else min(room, 16), 1, room, integer=True)
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not (isinstance(stop, list) and len(stop) <= MAX_STOPS and all(isinstance(s, str) and s for s in stop)):
        raise RequestError(f"stop: a non-empty string or a list of at most {MAX_STOPS}", "stop")
    seed = body.get("seed")
    if seed is None:
        seed = int.from_bytes(os.urandom(7), "little")
    elif isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise RequestError(f"seed: a non-negative integer, got {seed!r}", "seed")
    sampling = SamplingParams(temperature=float(_number(body, "temperature", 1.0, 0.0, 2.0)),
                              top_p=float(_number(body, "top_p", 1.0, 1e-6, 1.0)),
                              top_k=_number(body, "top_k", 0, 0, model.cfg.vocab_size, integer=True), seed=seed)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("stream: true or false", "stream")
    return Request(ids, max_tokens, sampling, stop, stream, chat)


def generate(model, req: Request) -> Iterator[tuple[str, str | None, int]]:
    """Yield (text delta, finish_reason or None, tokens sampled so far); the last has a finish_reason.

    Text is decoded from all tokens so far, so multi-byte characters split across tokens come out
    whole; a tail that could begin a stop string is held back until it cannot.
    """
    out, sent = [], 0
    hold = max((len(s) for s in req.stop), default=1) - 1
    for token in model.sample_tokens(req.prompt_ids, req.max_tokens, req.sampling):
        if token == model.cfg.eos_token_id:
            text = model.tokenizer.decode(out)
            yield text[sent:], "stop", len(out) + 1
            return
        out.append(token)
        text = model.tokenizer.decode(out)
        hits = [i for i in (text.find(s, max(0, sent - hold)) for s in req.stop) if i >= 0]
        if hits:
            yield text[sent:max(sent, min(hits))], "stop", len(out)
            return
        if text.endswith("\ufffd"):
            continue  # a character still being spelt out by the next token
        safe = len(text) - hold
        if safe > sent:
            yield text[sent:safe], None, len(out)
            sent = safe
    yield model.tokenizer.decode(out)[sent:], "length", len(out)


def response_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def now() -> int:
    return int(time.time())
