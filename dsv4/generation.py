"""Generation over any model that offers the DecodeModel calls (one rank or several): the
prefill-then-step loop that `generate`, `dsv4 chat` and `dsv4 serve` share."""

from __future__ import annotations

from typing import Iterator, Sequence

from .interface import DecodeModel
from .sampler import SamplingParams
from .tokenizer import TextStream


def sample_tokens(model: DecodeModel, ids: Sequence[int], max_tokens: int, sampling: SamplingParams | None = None,
                  capacity: int | None = None) -> Iterator[int]:
    """Prefill `ids`, then yield up to max_tokens sampled tokens, each fed back as the next input
    (EOS included: where to stop is the caller's)."""
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens {max_tokens!r}: a positive integer")
    state = model.new_state(capacity or len(ids) + max_tokens)
    if len(ids) > 1:
        model.prefill(state, ids[:-1])
    token = ids[-1]
    for _ in range(max_tokens):
        token = model.step(state, token, sampling)
        yield token
        if state.host_pos + 1 > state.capacity:
            return


def text_deltas(model: DecodeModel, ids: Sequence[int], max_tokens: int, sampling: SamplingParams | None = None,
                capacity: int | None = None, stop_at_eos: bool = True) -> Iterator[tuple[str, int]]:
    """(text, tokens sampled so far) as whole characters complete: a character whose UTF-8 bytes
    span several tokens comes out once, whole (dsv4.tokenizer.TextStream). The last pair, whose
    text may be empty, counts every sampled token (an EOS included)."""
    text = TextStream(model.tokenizer, model.cfg.eos_token_id if stop_at_eos else None)
    for token in sample_tokens(model, ids, max_tokens, sampling, capacity):
        delta = text.push(token)
        if text.finish:  # the EOS: its count comes with the last text, empty or not
            yield delta, text.n
            return
        if delta:
            yield delta, text.n
    yield text.end("length"), text.n


def generate(model: DecodeModel, prompt: str | Sequence[int], max_tokens: int = 64,
             sampling: SamplingParams | None = None, capacity: int | None = None,
             stop_at_eos: bool = True) -> Iterator[str]:
    """Yield the generated text as its characters complete (joined: the decode of every token)."""
    ids = model.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    for delta, _ in text_deltas(model, ids, max_tokens, sampling, capacity, stop_at_eos):
        if delta:
            yield delta
