"""Prefix caching: a prompt that begins with an earlier prompt's first P tokens starts from the decode state those
P tokens left, and prefills only the rest; its state and its tokens are bit for bit those it has without the cache.

Why P is a multiple of the prefill chunk: a state's bytes follow its prompt and its chunking alone (docs/DESIGN.md,
"Batched decode": a chunk computes each row as alone, a long chunk is one sequence's), and a prompt is chunked from
position 0. So the state after the chunks up to P is the one every prompt beginning with those P tokens reaches at
P; restored, the prompt runs from P the very chunks it runs anyway. (A state whose tokens were decoded, a reply,
is not the state those tokens prefilled would leave, so only prefills are cached.)

Where snapshots are taken, so that few whole states serve the common cases:
  * at the end of a prompt's prefill (its last chunk boundary before the token its first step takes): the next
    turn of a conversation resends the whole prompt, then the reply and the new message;
  * where a prompt leaves a cached one (the last chunk boundary within their common prefix): a system prompt, or
    a few-shot preamble, that many requests share.
Each entry is a whole DecodeState of the cache's capacity (the server's max_model_len), allocated once; the least
recently used entry gives way to a new one. An entry is found by the chain of its chunks' hashes and then compared
token for token, so a hash collision can cost a lookup, never a wrong state.

With the MTP layer (a drafted prefill, Model.prefill_batch_drafted) a state at P also holds the MTP layer's window,
which read the token at P: an entry is then keyed by P + 1 tokens.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Sequence

from .interface import DecodeModel

# The prefix states `dsv4 serve` keeps unless told (session 48: on mini on an H200, tokens identical with and without
# them, the time to first token 2.8x lower at 16 concurrent requests sharing a system prompt; a Flash state of 8,192
# tokens is 66 MiB a rank, beside the max_num_seqs states the server holds anyway)
SERVE_STATES = 4


@dataclass(frozen=True)
class Match:
    """A prompt's lookup: `tokens` of its prefill restored from `entry` (0 and None: none), and the positions past
    them where its prefill should offer the cache a snapshot (Cache.offer)."""

    tokens: int
    entry: object
    marks: tuple[int, ...]


class _Entry:
    __slots__ = ("state", "ids", "chain")

    def __init__(self, state):
        self.state, self.ids, self.chain = state, None, ()


class PrefixCache:
    """`entries` decode states of `capacity` tokens holding the states of prompts' first P tokens, P a multiple of
    `chunk` (the prefill chunk every prompt of the caller is prefilled in). `drafted`: the caller prefills with the
    MTP layer's window (Model.prefill_batch_drafted), so an entry is keyed by the token after its P tokens too."""

    def __init__(self, model: DecodeModel, entries: int, capacity: int, chunk: int, drafted: bool = False):
        for name, value in (("entries", entries), ("capacity", capacity), ("chunk", chunk)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"prefix cache {name} {value!r}: a positive integer")
        if chunk >= capacity:
            raise ValueError(f"prefix cache chunk {chunk} >= capacity {capacity}: no prompt of a state of {capacity} "
                             "tokens has a chunk boundary to cache")
        self.model, self.capacity, self.chunk, self.drafted = model, capacity, chunk, drafted
        self.free = []
        try:
            for _ in range(entries):
                self.free.append(_Entry(model.new_state(capacity)))
        except RuntimeError as e:  # torch.OutOfMemoryError is one: say which setting asked for the memory
            if "out of memory" not in str(e).lower():
                raise
            kept = len(self.free)
            self.free = []
            raise ValueError(f"prefix cache: {entries} states of {capacity} tokens do not fit in memory ({kept} did); "
                             "ask for fewer states or a smaller max_model_len") from None
        self.entries: collections.OrderedDict[tuple, _Entry] = collections.OrderedDict()  # least recent first
        self.prefixes: collections.Counter[int] = collections.Counter()  # chunk-chain hash -> entries passing it
        self.queries = self.hits = 0  # prefill tokens looked up, and found

    @property
    def size(self) -> int:
        return len(self.free) + len(self.entries)

    def _chain(self, ids: Sequence[int], blocks: int) -> list[int]:
        """The hash of each prefix of `blocks` whole chunks: chain[k - 1] covers ids[:k * chunk]."""
        chain, h, c = [], 0, self.chunk
        for k in range(blocks):
            h = hash((h, tuple(ids[k * c:(k + 1) * c])))
            chain.append(h)
        return chain

    def _key(self, chain: list[int], ids: Sequence[int], tokens: int) -> tuple:
        return (chain[tokens // self.chunk - 1], ids[tokens]) if self.drafted else (chain[tokens // self.chunk - 1],)

    def _span(self, tokens: int) -> int:
        """The prompt tokens an entry of `tokens` prefilled tokens is keyed by."""
        return tokens + self.drafted

    def match(self, prompt: Sequence[int]) -> Match:
        """The longest cached prefix of `prompt`'s prefill (prompt[:-1]: its last token is the first step's input)
        and where its prefill should offer snapshots: at its last chunk boundary, and at the last one it shares with
        a cached prompt it leaves. Counts the lookup (queries, hits)."""
        prompt = list(prompt)
        n = len(prompt) - 1  # the tokens a prefill writes
        blocks = max(0, n) // self.chunk
        chain = self._chain(prompt, blocks)
        found, entry = 0, None
        for k in range(blocks, 0, -1):
            e = self.entries.get(self._key(chain, prompt, k * self.chunk))
            if e is not None and e.ids == prompt[:self._span(k * self.chunk)]:
                found, entry = k * self.chunk, e
                break
        shared = next((k for k in range(blocks, 0, -1) if chain[k - 1] in self.prefixes), 0) * self.chunk
        marks = tuple(sorted({m for m in (blocks * self.chunk, shared) if m > found}))
        self.queries += max(0, n)
        self.hits += found
        return Match(found, entry, marks)

    def restore(self, state, match: Match):
        """Make a fresh `state` (no token committed) the state of its match's cached prefix (nothing: no entry)."""
        if match.entry is None:
            return
        if state.host_pos != 0:
            raise ValueError(f"prefix cache: a state holding {state.host_pos} tokens; a prompt starts from a fresh one")
        state.restore(match.entry.state)
        key = next(k for k, e in self.entries.items() if e is match.entry)
        self.entries.move_to_end(key)

    def offer(self, prompt: Sequence[int], tokens: int, state):
        """Keep a copy of `state`, which holds the prefill of prompt[:tokens] (`tokens` a multiple of the chunk), for
        later prompts that begin with them; the least recently used entry gives way when none is free."""
        if tokens % self.chunk or tokens <= 0 or tokens > len(prompt) - 1:
            raise ValueError(f"prefix cache: {tokens} tokens of a prompt of {len(prompt)}: a positive multiple of the "
                             f"chunk {self.chunk} below the prompt's length")
        if state.host_pos != tokens:
            raise ValueError(f"prefix cache: a state at {state.host_pos} tokens offered as the prefill of {tokens}")
        prompt = list(prompt)
        chain = self._chain(prompt, tokens // self.chunk)
        key = self._key(chain, prompt, tokens)
        if key in self.entries:
            self.entries.move_to_end(key)
            return
        entry = self.free.pop() if self.free else self._evict()
        try:
            entry.state.restore(state)
        except BaseException:
            entry.ids, entry.chain = None, ()
            self.free.append(entry)  # its bytes are half a copy: no key reaches them
            raise
        entry.ids, entry.chain = prompt[:self._span(tokens)], tuple(chain)
        self.entries[key] = entry
        self.prefixes.update(entry.chain)

    def _evict(self) -> _Entry:
        _, entry = self.entries.popitem(last=False)
        self.prefixes.subtract(entry.chain)
        for h in entry.chain:
            if self.prefixes[h] <= 0:
                del self.prefixes[h]
        entry.ids, entry.chain = None, ()
        return entry

    def prefill(self, state, prompt: Sequence[int]) -> int:
        """model.prefill(state, prompt[:-1], chunk_size=chunk) through the cache: from the longest cached prefix,
        snapshots offered at the match's marks; the state's bytes are the plain prefill's. Returns the tokens the
        cache gave."""
        if self.drafted:
            raise ValueError("prefix cache: a drafted cache (the MTP layer's windows) is filled by its caller's "
                             "drafted prefill, not by prefill()")
        if state.capacity != self.capacity:
            raise ValueError(f"prefix cache: a state of {state.capacity} tokens; the cache holds states of "
                             f"{self.capacity}")
        if state.host_pos != 0:
            raise ValueError(f"prefix cache: a state holding {state.host_pos} tokens; a prompt starts from a fresh one")
        prompt = list(prompt)
        match = self.match(prompt)
        self.restore(state, match)
        at = match.tokens
        for end in (*match.marks, len(prompt) - 1):
            if end > at:
                self.model.prefill(state, prompt[at:end], chunk_size=self.chunk)
                at = end
            if end in match.marks:
                self.offer(prompt, end, state)
        return match.tokens
