"""Speculative decoding whose stream is the plain one, bit for bit.

A drafter proposes the next few tokens; one verify step (Model.verify) runs the last token and the drafts through
the model in one forward, row j computed exactly as the decode step at pos + j (its row-wise work beside the other
rows', rows alone; its attention once rows 0..j-1 have written their cache rows), and draws each row with the
sampler's (seed, position) key, as model.step does. A draft is accepted while it equals the draw before it; the
step commits the rows up to the last accepted one and takes back the rest. So whatever the drafter proposes, the
tokens, the logits and the state's bytes are those of the plain step loop (`sample_tokens`): a drafter changes
only how many tokens each forward yields. Temperature 1 included: the draw at a position is a pure function of
that position's logits and key, which the verify row reproduces exactly.

Drafters: `NgramDrafter` (prompt lookup: the tokens that followed the latest earlier occurrence of the context's
last n-gram) and `ScriptedDrafter` (a given continuation, e.g. a reference stream: a benchmark's best case) need no
weights; `MtpDrafter` is the model's own MTP layer (DeepSeek-V4's `mtp.0.*`, dsv4.load(..., mtp=True)), run by
each verify step itself (Model.verify_draft), its drafts drawn with the sampler's key at their positions.

Cost: a verify step reads the weights once for all its rows, but its attention, compressors and indexer run row by
row (each row must see the one before it); it pays where the drafts are often right.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator, Sequence

from .generation import prefill
from .interface import DecodeModel
from .sampler import SamplingParams


# pad (DSV4_VERIFY_PAD=1; off until its GPU run, written in session 49 after the device time ran out): with graphs, a
# host drafter's proposal short of k drafts (the n-gram drafter often finds none) is padded to k with its last token
# (the context's last when it proposed none), so the step replays the full verify graph instead of running eagerly (an
# eager verify step on a Flash rank ~75-85 ms, the 4-row graph 24.6 ms with torch's Undo: benchmarks/RESULTS.md,
# session 49). Any drafts give the plain stream, so a pad is a draft like another (verified, counted as proposed, and
# kept when the model draws it); only where the budget left holds k drafts (a step never yields past it).
CONFIG = {"pad": os.environ.get("DSV4_VERIFY_PAD", "0") == "1"}


def padded(proposed: list[int], k: int, last: int) -> list[int]:
    """proposed, then its last token (or `last`, the context's, when it is empty) repeated up to k drafts."""
    return proposed + [proposed[-1] if proposed else last] * (k - len(proposed))


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the context's last n tokens (n from n_max down to
    n_min) and propose the tokens that followed it. Right where the output repeats its input (code edits, quoting,
    extraction, lists); no weights, no device work."""

    def __init__(self, n_max: int = 3, n_min: int = 1):
        if not (isinstance(n_min, int) and isinstance(n_max, int) and 1 <= n_min <= n_max):
            raise ValueError(f"NgramDrafter: n_min {n_min!r} and n_max {n_max!r}: integers, 1 <= n_min <= n_max")
        self.n_max, self.n_min = n_max, n_min

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        if k < 1:
            return []
        for n in range(min(self.n_max, len(context) - 1), self.n_min - 1, -1):
            tail = list(context[-n:])
            for start in range(len(context) - n - 1, -1, -1):  # the latest occurrence before the tail itself
                if list(context[start:start + n]) == tail:
                    return list(context[start + n:start + n + k])
        return []


class ScriptedDrafter:
    """Proposes a given continuation of the prompt: `script[i]` for generated token i (the tokens after the
    context's first `prompt` ones). With the plain stream as the script every draft is accepted (the machinery's
    best case); with anything else the verify steps reject what differs, and the stream is still the plain one."""

    def __init__(self, prompt: int, script: Sequence[int]):
        self.prompt, self.script = prompt, list(script)

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        done = len(context) - self.prompt
        return self.script[done:done + max(k, 0)]


class MtpDrafter:
    """The model's own MTP layer (DeepSeek-V4's multi-token prediction; dsv4.load(..., mtp=True)): each verify step
    also runs it (Model.verify_draft) and it drafts the next step's tokens on the device, drawn with the sampler's
    key at their positions. The stream is still the plain one; how often a draft is right is the layer's."""

    device = True  # drafts come back from the verify step itself, not from propose


DRAFTERS = {"ngram": NgramDrafter, "mtp": MtpDrafter}


@dataclass
class Tally:
    """What a speculative generation did: verify steps, drafts proposed and accepted, tokens yielded."""

    steps: int = 0
    proposed: int = 0
    accepted: int = 0
    tokens: int = 0

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0


def sample_tokens(model: DecodeModel, ids: Sequence[int], max_tokens: int, sampling: SamplingParams | None = None,
                  drafter=None, k: int = 4, capacity: int | None = None, stops: Sequence[int] = (),
                  tally: Tally | None = None, graph: bool = False) -> Iterator[int]:
    """dsv4.generation.sample_tokens with verify steps: prefill `ids` in the same chunks, then yield up to max_tokens
    tokens, each verify step proposing up to k drafts (drafter.propose(context, k); default NgramDrafter()). The
    tokens are generation.sample_tokens's, bit for bit, through to the first token in `stops` (yielded, then the
    generation ends: the plain loop's caller stops there too; rows after it are never committed). tally: counts
    the steps and drafts. graph (CUDA): each verify step of a full set of drafts replayed from its graph
    (Model.verify's graph; the same bits as eager, as a graph holds the same kernels)."""
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens {max_tokens!r}: a positive integer")
    if not isinstance(k, int) or k < 0:
        raise ValueError(f"k {k!r}: drafts a step, an integer >= 0")
    drafter = NgramDrafter() if drafter is None else drafter
    ids = list(ids)
    state = model.new_state(capacity or len(ids) + max_tokens)
    on_device, drafts = getattr(drafter, "device", False), []
    if on_device and k < 1:
        raise ValueError(f"k {k}: the MTP drafter drafts at least one token a step")
    if len(ids) > 1 and on_device:  # the same chunks; the MTP layer's window takes the prompt's last positions too,
        drafts = list(model.prefill_drafted(state, ids[:-1], ids[-1], sampling=sampling, k=k))  # and drafts
    elif len(ids) > 1:
        prefill(model, state, ids[:-1])
    yield from continue_tokens(model, state, ids[-1], ids[:-1], min(max_tokens, state.capacity - state.host_pos),
                               sampling, drafter, k, stops, tally, graph, drafts)


def continue_tokens(model: DecodeModel, state, token: int, context: Sequence[int], n: int,
                    sampling: SamplingParams | None = None, drafter=None, k: int = 4, stops: Sequence[int] = (),
                    tally: Tally | None = None, graph: bool = False, drafts: Sequence[int] = ()) -> Iterator[int]:
    """Up to n tokens from a state already at its position, `token` its next input and `context` the tokens before
    it (the n-gram drafter's text), by verify steps: sample_tokens's loop (the plain steps' tokens, bit for bit).
    drafts: the MTP drafter's for the first step (Model.prefill_drafted's), if any."""
    drafter = NgramDrafter() if drafter is None else drafter
    tally = Tally() if tally is None else tally
    on_device, drafts, ids = getattr(drafter, "device", False), list(drafts), [*context, token]
    out, stop = [], set(stops)
    while len(out) < n:
        # a step yields at most its drafts + 1 tokens: never more than the budget left
        room = n - len(out) - 1
        if on_device:
            proposed = drafts[:room]
            got, drafts = model.verify_draft(state, token, proposed, sampling, stops, k,
                                             graph=graph and len(proposed) == k)
            drafts = list(drafts)
        else:
            proposed = [int(t) for t in drafter.propose(ids + out, min(k, room))][:room]
            if graph and CONFIG["pad"] and len(proposed) < k <= room:
                proposed = padded(proposed, k, token)
            got = model.verify(state, token, proposed, sampling, stops, graph=graph and len(proposed) == k)
        tally.steps += 1
        tally.proposed += len(proposed)
        tally.accepted += len(got) - 1
        tally.tokens += len(got)
        for t in got:
            out.append(t)
            yield t
        token = got[-1]
        if token in stop:
            return
