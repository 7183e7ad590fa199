"""Generation over any model that offers the DecodeModel calls (one rank or several): the
prefill-then-step loop that `generate`, `dsv4 chat` and `dsv4 serve` share."""

from __future__ import annotations

from typing import Iterator, Sequence

from .interface import DecodeModel
from .sampler import SamplingParams


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


def generate(model: DecodeModel, prompt: str | Sequence[int], max_tokens: int = 64,
             sampling: SamplingParams | None = None, capacity: int | None = None,
             stop_at_eos: bool = True) -> Iterator[str]:
    """Yield the text of each generated token."""
    ids = model.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    for token in sample_tokens(model, ids, max_tokens, sampling, capacity):
        if stop_at_eos and token == model.cfg.eos_token_id:
            return
        yield model.tokenizer.decode([token])
