"""Constrained output by xgrammar (an optional dependency: pip install 'dsv4[json]'): response_format's JSON, vLLM's
structured_outputs (json, regex, choice, grammar, json_object) and a chat reply's tool calls (tool_choice 'required',
a named function or allowed_tools; tools with strict: true; parallel_tool_calls false).

Tool calls follow xgrammar's own DeepSeek-V4 structural tag (`get_model_structural_tag("deepseek_v4")`: the
<｜DSML｜tool_calls> block our encoder writes and dsv4.serve.chat's parser reads, each invoke's parameters in the
deepseek_xml style: string="true" raw text, string="false" JSON; whitespace in runs of at most one character, as
the encoder writes the block, so that a model cannot pad it without end): a reply that starts inside <think>
(thinking mode) reasons freely up to </think> first, as a JSON response_format does too (its JSON comes after the
reasoning).

A request's grammar compiles once (`compile_format`, `compile_structured`, `compile_tool_calls`, in the handler's
worker thread); each choice gets its own `Constraint`, a grammar matcher on the host: before each step the scheduler
asks it for the allowed tokens (a bitmask the step applies to the logits on the device, dsv4.sampler.process_logits),
after the step it accepts the token drawn, and the sequence ends when the matcher terminates (at EOS, once the JSON
is complete). JSON comes out compact (no optional whitespace: a model cannot pad it without end). `token_bytes`: a
token's own bytes (what logprobs report), from the same reading of the vocabulary.
"""

from __future__ import annotations

import functools
import json
import re

import torch


def _why(e: Exception) -> str:
    """xgrammar's message, its first line without the C++ source's time and place ("[09:10:20] /project/...: ")."""
    return re.sub(r"^\[[0-9:]+\] \S+?:\d+: ", "", str(e).splitlines()[0] if str(e) else repr(e))[:200]


class FormatError(ValueError):
    """A grammar this server cannot build (a schema, pattern or grammar xgrammar cannot read); `param` names the
    field."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.message, self.param = message, param


def _xgrammar(param: str = "response_format"):
    try:
        import xgrammar
    except ImportError:
        raise FormatError(f"{param}: constrained output needs xgrammar, which this server lacks "
                          "(pip install 'dsv4[json]')", param) from None
    return xgrammar


def _byte_level(tok) -> bool:
    decoder = json.loads(tok.to_str()).get("decoder") or {}
    kinds = [decoder.get("type")] + [d.get("type") for d in decoder.get("decoders", [])]
    return "ByteLevel" in kinds


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: the character a byte-level vocabulary spells each byte with."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), ord("\xff") + 1)]
    cs, extra = list(bs), 0
    for b in range(256):
        if b not in bs:  # the bytes that are not printable map past 255, in order
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(bs, cs)}


@functools.lru_cache(maxsize=4)
def _reading(tokenizer) -> tuple[bool, frozenset]:
    tok = tokenizer.tok
    return _byte_level(tok), frozenset(i for i, t in tok.get_added_tokens_decoder().items() if t.special)


def special_ids(tokenizer) -> frozenset:
    """The vocabulary's special tokens (BOS, EOS, ...): text the model's input marks, not text it spells."""
    return _reading(tokenizer)[1]


def token_bytes(tokenizer, token: int) -> bytes:
    """The bytes a token spells (a special token: its text; an id the tokenizer lacks: none)."""
    piece = tokenizer.tok.id_to_token(token) if token < tokenizer.vocab_size else None
    if piece is None:
        return b""
    byte_level, special = _reading(tokenizer)
    decoder = _byte_decoder()
    if byte_level and token not in special and all(ch in decoder for ch in piece):
        return bytes(decoder[ch] for ch in piece)
    return tokenizer.decode([token], skip_special_tokens=False).encode()


@functools.lru_cache(maxsize=4)
def _markup(text: str) -> bool:
    """A special token the grammars spell (where a vocabulary makes them special): <think>, </think>, DSML's."""
    return text in THINK_MARKERS or "｜DSML｜" in text


def _compiler(tokenizer, vocab_size: int, eos_id: int):
    """One grammar compiler per tokenizer: its vocabulary as xgrammar reads it (ids the tokenizer lacks and special
    tokens are "": never allowed, but for the markup the grammars spell, which a model writes as its own token where
    the vocabulary has one: its text), EOS the stop token."""
    xgr = _xgrammar()
    tok = tokenizer.tok
    added = tok.get_added_tokens_decoder()
    special = {i for i, t in added.items() if t.special and not _markup(t.content)}
    markup = {i: t.content for i, t in added.items() if t.special and _markup(t.content)}
    byte_level = _byte_level(tok)
    vocab = []
    for i in range(vocab_size):
        piece = tok.id_to_token(i) if i < tokenizer.vocab_size and i not in special else None
        if i in markup:
            piece = markup[i]  # ASCII and "｜": the same bytes read as byte-level or raw
        elif piece is not None and not byte_level:
            piece = tok.decode([i], skip_special_tokens=False)
        vocab.append(piece or "")
    kind = xgr.VocabType.BYTE_LEVEL if byte_level else xgr.VocabType.RAW
    info = xgr.TokenizerInfo(vocab, kind, vocab_size=vocab_size, stop_token_ids=[eos_id])
    return xgr.GrammarCompiler(info)


THINK_MARKERS = ["<think>", "</think>"]  # never inside the reasoning's free text (xgrammar's deepseek_v4 excludes)


def _reasoning():
    """Free text up to </think>: the reasoning of a reply that starts inside <think>."""
    xgr = _xgrammar()
    from xgrammar.structural_tag import AnyTextFormat, TagFormat

    return xgr.Grammar.from_structural_tag(xgr.StructuralTag(
        format=TagFormat(begin="", content=AnyTextFormat(excludes=THINK_MARKERS), end="</think>")))


def compile_format(response_format: dict, model, reasoning: bool = False):
    """The compiled grammar of a json_object or json_schema response_format (after the reasoning, when the reply
    starts inside <think>: the same JSON); a schema xgrammar refuses is a 400."""
    if response_format["type"] == "json_object":
        return _compile_json({"type": "object"}, "response_format", model, reasoning)
    return _compile_json(response_format["json_schema"]["schema"], "response_format.json_schema.schema", model,
                         reasoning)


def compile_structured(spec: dict, model, reasoning: bool = False):
    """The compiled grammar of vLLM's structured_outputs (one kind, checked by dsv4.serve.protocol): json, json_object,
    regex, choice (one of the strings, each as it is) or grammar (xgrammar's EBNF, its rule root); after the
    reasoning when the reply starts inside <think>. What xgrammar cannot read is a 400 naming the key."""
    (kind, value), = spec.items()
    param = f"structured_outputs.{kind}"
    if kind in ("json", "json_object"):
        return _compile_json({"type": "object"} if kind == "json_object" else value, param, model, reasoning)
    xgr = _xgrammar(param)
    try:
        if kind == "regex":
            body = xgr.Grammar.from_regex(value)
        elif kind == "grammar":
            body = xgr.Grammar.from_ebnf(value)
        else:
            from xgrammar.structural_tag import ConstStringFormat, OrFormat

            body = xgr.Grammar.from_structural_tag(xgr.StructuralTag(
                format=OrFormat(elements=[ConstStringFormat(value=c) for c in dict.fromkeys(value)])))
    except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError for a pattern or grammar it cannot parse
        what = {"regex": "a regular expression", "grammar": "an EBNF grammar", "choice": "choices"}[kind]
        raise FormatError(f"{param}: not {what} xgrammar reads: {_why(e)}", param) from None
    return _compile(body, model, reasoning)


def _compile_json(schema, param: str, model, reasoning: bool):
    xgr = _xgrammar(param)
    compiler = _compiler(model.tokenizer, model.cfg.vocab_size, model.cfg.eos_token_id)
    try:
        if not reasoning:
            return compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
        return _compile(xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False), model, reasoning)
    except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError / InvalidJSONError for a schema it cannot read
        raise FormatError(f"{param}: not a JSON schema xgrammar compiles: {_why(e)}",
                           param) from None


def _compile(body, model, reasoning: bool):
    """`body` (an xgrammar Grammar), after the reasoning when the reply starts inside <think>, compiled."""
    xgr = _xgrammar()
    compiler = _compiler(model.tokenizer, model.cfg.vocab_size, model.cfg.eos_token_id)
    return compiler.compile_grammar(xgr.Grammar.concat(_reasoning(), body) if reasoning else body)


def compile_tool_calls(calls, model, reasoning: bool):
    """The compiled grammar of a chat reply held to `calls` (dsv4.serve.chat.ToolCalls): DeepSeek-V4's DSML tool-call
    block by xgrammar's deepseek_v4 structural tag, after free reasoning when the reply starts inside <think>. A strict
    tool's parameters that xgrammar cannot read are a 400 naming that tool."""
    xgr = _xgrammar(calls.asked_by)
    if "deepseek_v4" not in getattr(xgr.builtin_structural_tag, "_structural_tag_registry", {}):
        raise FormatError(f"{calls.asked_by}: the tool-call grammar needs xgrammar >= 0.2.9 (its deepseek_v4 "
                          "structural tag; pip install -U 'dsv4[json]')", calls.asked_by)
    compiler = _compiler(model.tokenizer, model.cfg.vocab_size, model.cfg.eos_token_id)
    for i, tool in zip(calls.positions, calls.tools):
        function = tool["function"]
        if function["strict"] and function["parameters"] is not None:
            try:
                xgr.Grammar.from_json_schema(json.dumps(function["parameters"]))
            except Exception as e:  # noqa: BLE001 - as compile_format's
                param = f"tools[{i}].function.parameters"
                raise FormatError(f"{param}: not a JSON schema xgrammar compiles: {_why(e)}",
                                  param) from None
    choice = {"auto": "auto", "required": "required",
              "forced": {"type": "function", "function": {"name": calls.tools[0]["function"]["name"]}}}[calls.choice]
    tag = xgr.get_model_structural_tag("deepseek_v4", tools=list(calls.tools), tool_choice=choice,
                                       reasoning="enabled" if reasoning else "disabled",
                                       parallel_tool_calls=calls.parallel, max_whitespace_cnt=1)
    try:
        return compiler.compile_structural_tag(tag)
    except Exception as e:  # noqa: BLE001 - a schema the per-tool check passed but the tag's conversion refuses
        raise FormatError(f"tools: xgrammar cannot build the tool-call grammar: {_why(e)}",
                          "tools") from None


class Constraint:
    """One sequence's grammar matcher (scheduler thread only)."""

    def __init__(self, compiled, vocab_size: int):
        xgr = _xgrammar()
        self.matcher = xgr.GrammarMatcher(compiled)
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def mask(self) -> torch.Tensor:
        """The tokens allowed next: int32 [ceil(vocab / 32)] (bit j of word i: token 32 i + j)."""
        self.matcher.fill_next_token_bitmask(self.bitmask)
        return self.bitmask[0].clone()

    def accept(self, token: int) -> None:
        if not self.matcher.accept_token(token):
            raise RuntimeError(f"the grammar refused token {token}, drawn under its own mask")

    @property
    def terminated(self) -> bool:
        return self.matcher.is_terminated()


def token_mask(vocab_size: int, allowed=None, banned=()) -> torch.Tensor:
    """A constraint's bitmask without a grammar (vLLM's allowed_token_ids; min_tokens' EOS and stop ids kept out):
    int32 [ceil(vocab / 32)], bit j of word i for token 32 i + j as xgrammar lays it out; `allowed` None: all."""
    import numpy as np

    words = (vocab_size + 31) // 32
    bits = np.zeros(words * 32, dtype=bool)
    if allowed is None:
        bits[:vocab_size] = True
    else:
        bits[list(allowed)] = True
    bits[list(banned)] = False
    packed = np.packbits(bits.reshape(words, 32), axis=1, bitorder="little")  # [words, 4] bytes, bit 0 first
    return torch.from_numpy(packed.copy().view("<i4").reshape(words))


class BadWords:
    """vLLM's bad_words, as token sequences (each word with and without a leading space, as vLLM tokenises them):
    a word's last token is kept out of a step whose tokens so far end with the rest of it (a one-token word: of every
    step). `mask(generated)` is that step's bitmask (token_mask), None where nothing is kept out."""

    def __init__(self, words: tuple[tuple[int, ...], ...], vocab_size: int):
        self.words, self.vocab_size = words, vocab_size
        self.longest = max(len(w) for w in words)

    def mask(self, generated: list[int]) -> torch.Tensor | None:
        banned = {w[-1] for w in self.words if len(w) == 1 or tuple(generated[-(len(w) - 1):]) == w[:-1]}
        return token_mask(self.vocab_size, banned=sorted(banned)) if banned else None
