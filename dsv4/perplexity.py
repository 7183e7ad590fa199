"""Perplexity of a text under the model, its tokens scored by the prefill itself (Model.prefill_scored).

The text's tokens go in consecutive windows of `ctx` tokens (the last may be shorter): each window is prefilled
from an empty state, in chunks of the model's prefill chunk, and each of its tokens after the first is scored given
the tokens before it in the window (the first token of a window has no context and is not scored). perplexity =
exp(mean negative log-likelihood of the scored tokens). A checkpoint's figure on a known text says whether it runs
as trained (the oracle checks the math; this checks a user's own weights); `dsv4 perplexity` prints it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Perplexity:
    tokens: int  # tokens scored
    windows: int
    ctx: int
    nll: float  # mean negative log-likelihood of the scored tokens (nats)

    @property
    def ppl(self) -> float:
        return math.exp(self.nll)


def perplexity(model, ids: Sequence[int], ctx: int, chunk: int | None = None) -> Perplexity:
    """`ids` scored in windows of `ctx` tokens (see the module); `chunk`: the prefill chunk (the model's default for a
    state of ctx tokens when None)."""
    ids = list(ids)
    if ctx < 2:
        raise ValueError(f"ctx {ctx}: at least 2 (a window's first token has no context)")
    if len(ids) < 2:
        raise ValueError(f"{len(ids)} token(s): at least 2 to score one")
    chunk = chunk or model.prefill_chunk(ctx)
    total, scored, windows = 0.0, 0, 0
    state = model.new_state(ctx)
    for start in range(0, len(ids) - 1, ctx):  # a window of at least 2 tokens (a lone last token has no context)
        window = ids[start:start + ctx]
        try:
            for a in range(0, len(window) - 1, chunk):
                piece = window[a:min(a + chunk, len(window) - 1)]
                scores = model.prefill_scored(state, piece, window[a + 1:a + 1 + len(piece)])
                total -= sum(s.logprob for s in scores)
                scored += len(scores)
        finally:
            state.discard()  # zeroed: the next window starts from an empty state
        windows += 1
    return Perplexity(scored, windows, ctx, total / scored)
