"""Generation over any model that offers the DecodeModel calls (one rank or several): the
prefill-then-step loop that `generate`, `dsv4 chat` and `dsv4 serve` share."""

from __future__ import annotations

import sys
from typing import Iterator, Sequence

from .interface import DecodeModel
from .sampler import SamplingParams
from .tokenizer import TextStream


def prefill(model: DecodeModel, state, ids: Sequence[int], progress: bool = False, chunk_size: int | None = None):
    """model.prefill(state, ids) in its chunks (default: model.prefill_chunk, as model.prefill takes them, so
    the same bits), with a bar over the prompt's tokens when `progress` and stderr is a terminal and the
    prompt spans several chunks (someone is waiting for the first token)."""
    if not progress or not sys.stderr.isatty():
        return model.prefill(state, ids) if chunk_size is None else model.prefill(state, ids, chunk_size=chunk_size)
    chunk = chunk_size or model.prefill_chunk(state.capacity)
    if len(ids) <= chunk:
        return model.prefill(state, ids, chunk_size=chunk)
    from tqdm import tqdm

    with tqdm(total=len(ids), desc="prefill", unit="tok", leave=False, file=sys.stderr) as bar:
        for start in range(0, len(ids), chunk):
            part = ids[start:start + chunk]
            model.prefill(state, part, chunk_size=chunk)
            bar.update(len(part))


def sample_tokens(model: DecodeModel, ids: Sequence[int], max_tokens: int, sampling: SamplingParams | None = None,
                  capacity: int | None = None, progress: bool = False) -> Iterator[int]:
    """Prefill `ids` (a bar on a terminal with `progress`), then yield up to max_tokens sampled tokens, each
    fed back as the next input (EOS included: where to stop is the caller's)."""
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens {max_tokens!r}: a positive integer")
    state = model.new_state(capacity or len(ids) + max_tokens)
    if len(ids) > 1:
        prefill(model, state, ids[:-1], progress)
    token = ids[-1]
    for _ in range(max_tokens):
        token = model.step(state, token, sampling)
        yield token
        if state.host_pos + 1 > state.capacity:
            return


def text_deltas(model: DecodeModel, ids: Sequence[int], max_tokens: int, sampling: SamplingParams | None = None,
                capacity: int | None = None, stop_at_eos: bool = True, progress: bool = False
                ) -> Iterator[tuple[str, int]]:
    """(text, tokens sampled so far) as whole characters complete: a character whose UTF-8 bytes
    span several tokens comes out once, whole (dsv4.tokenizer.TextStream). The last pair, whose
    text may be empty, counts every sampled token (an EOS included)."""
    text = TextStream(model.tokenizer, model.cfg.eos_token_id if stop_at_eos else None)
    for token in sample_tokens(model, ids, max_tokens, sampling, capacity, progress):
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
