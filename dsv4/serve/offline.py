"""Offline batch generation: many prompts through the server's scheduler in the calling thread, no HTTP.

`generate_many(model, prompts, ...)` is what `dsv4 serve` does with the prompts as concurrent requests: continuous
batching over `max_num_seqs` slots (one batched step for every decoding sequence, on CUDA a graph per bucket),
chunked prefill between the steps, short prompts prefilled in grouped forwards, the prefix cache when asked. Every
prompt's tokens are those it draws alone (`model.sample_tokens`, its sampler keyed by (seed, position)): a batched
row is the solo step bit for bit, and a prompt's chunk boundaries are its own. So a run is reproducible whatever the
batch around each prompt, and one prompt's result can be checked alone.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Sequence

from ..sampler import SamplingParams
from ..tokenizer import TextStream
from .scheduler import Scheduler
from .scheduler import Sequence as Seq


@dataclass
class Completion:
    """One prompt's result: its sampled tokens (an EOS that ended it included), the text they spell (the EOS and
    anything past a stop string left out), why it ended ("stop": EOS or a stop string; "length": max_tokens), and
    the prompt tokens a prefix cache gave (not prefilled again)."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    cached_tokens: int = 0


class GenerationError(RuntimeError):
    """A forward failed for some prompts (an engine error): `completions` holds every prompt's result, None where it
    failed; `failed` maps those prompts' indices to the error."""

    def __init__(self, completions: list, failed: dict):
        first = min(failed)
        super().__init__(f"dsv4 generate_many: {len(failed)} of {len(completions)} prompts failed (prompt {first}: "
                         f"{failed[first]})")
        self.completions, self.failed = completions, failed


def _per_prompt(value, n: int, name: str) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"generate_many: {len(value)} values of {name} for {n} prompts (one, or one a prompt)")
        return list(value)
    return [value] * n


def generate_many(model, prompts: Sequence[str | Sequence[int]], max_tokens: int | Sequence[int] = 64,
                  sampling: SamplingParams | Sequence[SamplingParams] | None = None, *, stop: Sequence[str] = (),
                  max_num_seqs: int = 16, max_model_len: int | None = None, prefill_chunk: int | None = None,
                  prefix_cache: int = 0, progress: bool = False) -> list[Completion]:
    """Generate for every prompt (text, or token ids), batched as a server batches concurrent requests; the results
    in the prompts' order, each the prompt's stream alone. `max_tokens` and `sampling` are one for all or one a
    prompt (sampling None: SamplingParams(), seed 0; give each prompt its own seed for independent draws).
    `max_model_len`: the tokens of a slot (default: the longest prompt plus its max_tokens); `prefill_chunk`: the
    model's default for it, as model.sample_tokens takes. `progress`: a bar over the prompts on a terminal."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
        raise ValueError("generate_many: prompts must be a non-empty list of texts or of token-id lists")
    tok = model.tokenizer
    ids = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            p = tok.encode(p)
        elif not (isinstance(p, Sequence) and all(isinstance(t, int) and not isinstance(t, bool) for t in p)):
            raise ValueError(f"generate_many: prompt {i} is neither a text nor a list of token ids")
        p = list(p)
        if not p:
            raise ValueError(f"generate_many: prompt {i} is empty (a prompt needs at least one token)")
        bad = next((t for t in p if not 0 <= t < model.cfg.vocab_size), None)
        if bad is not None:
            raise ValueError(f"generate_many: prompt {i} holds token id {bad}, outside the vocabulary "
                             f"[0, {model.cfg.vocab_size})")
        ids.append(p)
    n = len(ids)
    max_tokens = _per_prompt(max_tokens, n, "max_tokens")
    for i, m in enumerate(max_tokens):
        if not isinstance(m, int) or isinstance(m, bool) or m < 1:
            raise ValueError(f"generate_many: max_tokens {m!r} of prompt {i}: a positive integer")
    samplings = _per_prompt(sampling if sampling is not None else SamplingParams(), n, "sampling")
    for i, s in enumerate(samplings):
        if not isinstance(s, SamplingParams):
            raise ValueError(f"generate_many: sampling of prompt {i} is a {type(s).__name__}, not a SamplingParams")
    longest = max(len(p) + m for p, m in zip(ids, max_tokens))
    limit = model.cfg.max_position_embeddings
    if max_model_len is None:
        max_model_len = min(longest, limit)
    if max_model_len > limit:
        raise ValueError(f"generate_many: max_model_len {max_model_len}: the model's max_position_embeddings is {limit}")
    for i, (p, m) in enumerate(zip(ids, max_tokens)):
        if len(p) + m > max_model_len:
            raise ValueError(f"generate_many: prompt {i} ({len(p)} tokens) plus max_tokens {m} exceeds max_model_len "
                             f"{max_model_len}")
    if prefill_chunk is None:
        prefill_chunk = model.prefill_chunk(max_model_len)
    sched = Scheduler(model, min(max_num_seqs, n), max_model_len, max_waiting=n, prefill_chunk=prefill_chunk,
                      prefix_cache=prefix_cache)

    texts = [TextStream(tok, model.cfg.eos_token_id, stop) for _ in range(n)]
    pieces: list[list[str]] = [[] for _ in range(n)]
    tokens: list[list[int]] = [[] for _ in range(n)]
    finish: list[str | None] = [None] * n
    failed: dict[int, Exception] = {}
    seqs: list[Seq] = []

    def emitter(i):
        def emit(event):
            kind, value = event
            if kind == "token":
                if texts[i].finish:
                    return  # past a stop string: the sequence is cancelled, a step already launched drew this
                tokens[i].append(value)
                pieces[i].append(texts[i].push(value))
                if texts[i].finish:  # EOS or a stop string: the scheduler frees the slot
                    finish[i] = texts[i].finish
                    seqs[i].cancel()
            elif kind == "done":
                finish[i] = finish[i] or value
            else:
                failed[i] = value
        return emit

    seqs.extend(Seq(p, m, s, emitter(i)) for i, (p, m, s) in enumerate(zip(ids, max_tokens, samplings)))
    bar = None
    if progress and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=n, desc="generate", unit="prompt", leave=False, file=sys.stderr)
    try:
        for seq in seqs:
            sched.submit(seq)
        done = 0
        while sched.running or sched.waiting:
            sched._admit()
            sched._round()
            if bar is not None:
                now = sum(f is not None for f in finish) + len(failed)
                bar.update(now - done)
                done = now
        sched._drain()
    finally:
        if bar is not None:
            bar.close()
    out: list = []
    for i in range(n):
        if i in failed:
            out.append(None)
            continue
        if not texts[i].finish:
            pieces[i].append(texts[i].end("length"))
        out.append(Completion(ids[i], tokens[i], "".join(pieces[i]), finish[i] or "length", seqs[i].cached or 0))
    seqs.clear()  # each emitter holds seqs (it cancels its sequence): no cycle left to the cycle collector (see
    # Scheduler.driven_inline), so the scheduler's states and graphs go when this returns
    sched.driven_inline()
    if failed:
        raise GenerationError(out, failed)
    return out
