"""response_format: JSON output constrained by xgrammar (an optional dependency: pip install 'dsv4[json]').

A request's format compiles once (`compile_format`, in the handler's worker thread); each choice gets its
own `Constraint`, a grammar matcher on the host: before each step the scheduler asks it for the allowed
tokens (a bitmask the step applies to the logits on the device, dsv4.sampler.process_logits), after the
step it accepts the token drawn, and the sequence ends when the matcher terminates (at EOS, once the JSON
is complete). JSON comes out compact (no optional whitespace: a model cannot pad it without end). `token_bytes`: a
token's own bytes (what logprobs report), from the same reading of the vocabulary.
"""

from __future__ import annotations

import functools
import json

import torch


class FormatError(ValueError):
    """A response_format this server cannot serve; `param` names the field."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.message, self.param = message, param


def _xgrammar():
    try:
        import xgrammar
    except ImportError:
        raise FormatError("response_format: json_object and json_schema need xgrammar, which this server lacks "
                           "(pip install 'dsv4[json]')", "response_format") from None
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
def _compiler(tokenizer, vocab_size: int, eos_id: int):
    """One grammar compiler per tokenizer: its vocabulary as xgrammar reads it (special tokens and ids the
    tokenizer lacks are "": never allowed), EOS the stop token."""
    xgr = _xgrammar()
    tok = tokenizer.tok
    special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    byte_level = _byte_level(tok)
    vocab = []
    for i in range(vocab_size):
        piece = tok.id_to_token(i) if i < tokenizer.vocab_size and i not in special else None
        if piece is not None and not byte_level:
            piece = tok.decode([i], skip_special_tokens=False)
        vocab.append(piece or "")
    kind = xgr.VocabType.BYTE_LEVEL if byte_level else xgr.VocabType.RAW
    info = xgr.TokenizerInfo(vocab, kind, vocab_size=vocab_size, stop_token_ids=[eos_id])
    return xgr.GrammarCompiler(info)


def compile_format(response_format: dict, model):
    """The compiled grammar of a json_object or json_schema response_format; a schema xgrammar refuses is a 400."""
    compiler = _compiler(model.tokenizer, model.cfg.vocab_size, model.cfg.eos_token_id)
    if response_format["type"] == "json_object":
        schema, param = {"type": "object"}, "response_format"
    else:
        schema, param = response_format["json_schema"]["schema"], "response_format.json_schema.schema"
    try:
        return compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
    except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError / InvalidJSONError for a schema it cannot read
        raise FormatError(f"{param}: not a JSON schema xgrammar compiles: {str(e).splitlines()[0][:200]}",
                           param) from None


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
