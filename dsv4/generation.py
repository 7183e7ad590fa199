"""Generation over any model that offers the DecodeModel calls (one rank or several): the
prefill-then-step loop that `generate`, `dsv4 chat` and `dsv4 serve` share."""

from __future__ import annotations

import sys
from typing import Iterator, Sequence

from .interface import DecodeModel
from .sampler import SamplingParams
from .state import RefusalError, StepHeld
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
                  capacity: int | None = None, progress: bool = False, chunk_size: int | None = None,
                  prefix=None) -> Iterator[int]:
    """Prefill `ids` (a bar on a terminal with `progress`; chunks of chunk_size, default the model's), then yield up
    to max_tokens sampled tokens, each fed back as the next input (EOS included: where to stop is the caller's).
    prefix: a dsv4.prefix.PrefixCache to prefill through (its capacity and chunk; the same bytes as without it)."""
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens {max_tokens!r}: a positive integer")
    if prefix is not None:
        if capacity not in (None, prefix.capacity) or chunk_size not in (None, prefix.chunk):
            raise ValueError(f"sample_tokens: capacity {capacity} and chunk_size {chunk_size} with a prefix cache of "
                             f"states of {prefix.capacity} tokens at chunks of {prefix.chunk}")
        state = model.new_state(prefix.capacity)
        prefix.prefill(state, ids)
    else:
        state = model.new_state(capacity or len(ids) + max_tokens)
        if len(ids) > 1:
            prefill(model, state, ids[:-1], progress, chunk_size)
    token = ids[-1]
    steps = min(max_tokens, state.capacity - state.host_pos)
    # On one GPU the step as a graph, one step in flight (graph == eager, bit for bit). Over several ranks the step
    # loop until the pipelined batch graph has run on two GPUs (no 2-GPU machine since session 10).
    if model.device.type == "cuda" and model.world == 1:
        yield from pipelined_tokens(model, state, token, steps, sampling)
        return
    for _ in range(steps):
        token = model.step(state, token, sampling)
        yield token


def pipelined_tokens(model: DecodeModel, state, token: int, n: int, sampling: SamplingParams | None = None,
                     graph: bool = True, keep_graph: bool = False) -> Iterator[int]:
    """n sampled steps of `state` from `token`, one step always in flight: step i + 1 is launched, its input read
    on the device (Model.step_batch_launch's feed: the token step i drew), before step i's token reaches the host,
    so the readback and the host's work on each token overlap the device's next step. The tokens are
    model.step's: a batched step of one row is the solo step, bit for bit (DESIGN.md, batched == solo).

    graph: each step a replay of the state's one-row batch graph (CUDA), captured at the first step and dropped
    when the loop ends (a new state, a new graph: nothing is kept past it; keep_graph keeps it for the next loop
    over the same state, as `dsv4 bench`'s rows restored from one prefix). The caller may stop early (an EOS):
    the step in flight is then settled and its token dropped, so the state ends one step past the last token
    yielded. A refused step raises RefusalError when it settles (the state quarantined, nothing committed); the
    step launched behind it committed nothing either (the device's hold) and is settled quietly."""
    if n < 1:
        return
    samplings = [sampling]
    launched = settled = 0
    try:
        model.step_batch_launch([state], [token], samplings, feed=[False], graph=graph)
        launched = 1
        while settled < n:
            if launched < n:
                model.step_batch_launch([state], [None], samplings, feed=[True], graph=graph)
                launched += 1
            settled += 1  # settling takes the step off the pending list, raising or not
            yield model.step_batch_settle()[0]
    finally:
        for _ in range(launched - settled):
            try:
                model.step_batch_settle()
            except (RefusalError, StepHeld):  # behind a refusal already raised, or after the caller stopped
                pass
        if graph and not keep_graph:
            model.drop_batch([state])


def text_deltas(model: DecodeModel, ids: Sequence[int], max_tokens: int, sampling: SamplingParams | None = None,
                capacity: int | None = None, stop_at_eos: bool = True, progress: bool = False,
                tokens: Iterator[int] | None = None) -> Iterator[tuple[str, int]]:
    """(text, tokens sampled so far) as whole characters complete: a character whose UTF-8 bytes
    span several tokens comes out once, whole (dsv4.tokenizer.TextStream). The last pair, whose
    text may be empty, counts every sampled token (an EOS included). tokens: the sampled tokens of `ids` from
    elsewhere (dsv4.speculative.sample_tokens: the same ones), instead of sample_tokens here."""
    text = TextStream(model.tokenizer, model.cfg.eos_token_id if stop_at_eos else None)
    if tokens is None:
        tokens = sample_tokens(model, ids, max_tokens, sampling, capacity, progress)
    for token in tokens:
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
