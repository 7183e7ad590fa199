"""One scheduler thread owns the engine; request handlers talk to it through queues.

A request becomes one `Sequence` (its own prompt, sampling parameters and output queue). The
scheduler holds a pool of `max_num_seqs` DecodeStates of `max_model_len` tokens (one StatePool), allocated once
and reused (zeroed on release, so a reused slot is byte for byte a fresh one). Each round:

  1. take what handlers sent (new sequences wait in arrival order; cancellations are flags);
  2. admit waiting sequences into free slots;
  3. advance every active sequence by one unit of work: a sequence still in its prompt runs its
     next prefill chunk (`prefill_chunk` tokens; the short chunks of one length together, in one
     forward: `Model.prefill_batch`, a longer chunk in a forward of its own); all the others take one
     batched step together (`Model.step_batch`: one forward for all of them, each row with its own
     position, caches and sampling parameters on the device);
  4. drop finished or cancelled sequences, zero their slots.

So a long prompt costs the running sequences one chunk per round, not its whole prefill.

The decode steps are pipelined (`pipelined`, on by default): a round launches its step
(`Model.step_batch_launch`, each continuing row's input fed on the device from its last draw) before it
settles the previous round's step (`step_batch_settle`), so the host's work on a step's tokens (emitting
them, the HTTP stream, the next round's bookkeeping) runs while the device computes the next step. A
sequence is launched only while its generated plus launched tokens are below max_tokens; one that stops
at EOS has one more step already launched, whose token is dropped; its slot is freed once that step has
settled. A step launched behind a refusal commits nothing (StepHeld): its sequences run it again. A round
with logit processing or a grammar (which need the previous token on the host) first settles what is
launched and runs unpipelined; so does a round with prefill chunks (the launched step's tokens are sent
before the prefill, not after it). A batched
step and a grouped short chunk compute every row as that row alone (dsv4.model.rows), a sequence's
chunk boundaries come from its own prompt and `prefill_chunk` alone, and the sampler is keyed by (seed,
position), so a sequence's tokens are the same alone or among any others, and the same as
`Model.sample_tokens` (whose prefill chunks have the same boundaries).

On CUDA the batched step is a captured graph per bucket of slots (1, 2, 4, ... up to max_num_seqs):
a round runs the smallest bucket holding every decoding sequence's slot, the bucket's other slots
as inactive rows (they compute and commit nothing). Slots are handed out lowest first, so the
buckets stay small; sequences join and leave between steps without a recapture.

Speculative decoding (`speculate`: "ngram" or "mtp", off by default): a round whose one decoding sequence has no
logit processing or grammar runs a verify step for it (Model.verify / verify_draft: its drafts' tokens, then the
rest as a plain step would draw them), unpipelined; its tokens are the plain step's, bit for bit, so a sequence's
stream is the same with it or without. With two or more decoding sequences the batched step runs as ever, and so it
does where the n-gram drafter proposes nothing (a verify step of no drafts is the plain step, without its graph).

Prefix caching (`prefix_cache` states, off by default; dsv4.prefix): a new sequence whose prompt begins with a cached
prompt's chunks starts from their state, and its prefill offers the cache snapshots at its marks; one that shares
more of its prompt with a sequence prefilling now (a burst of requests with one system prompt, a request's n choices)
follows it and copies its state when that prefill reaches their shared chunk boundary (or, for the same prompt, its
end). Either way a sequence's bytes and tokens are those of its own prefill.
A sequence that echoes its prompt's logprobs (`prompt_logprobs`) takes neither: its chunks run alone through
`Model.prefill_scored` (the same state as a plain prefill; each row's next prompt token scored), each chunk's scores
sent as ("prompt", [(logprob, top), ...]) before its first token.

n choices of one request are n Sequences (the handler tags each one's events with its choice
index). A sequence with logit processing (`logits`: penalties, logit_bias, min_p, logprobs) or a
grammar (`constraint`: response_format) makes its round's step `Model.step_batch_processed`: its
row is processed on the device (its token counts restart from its prompt at its first step), the
grammar's allowed tokens are filled in before the step and the token drawn accepted after it. A
round where no sequence has either runs the plain `step_batch`. vLLM's allowed_token_ids (every step), min_tokens (its
first steps: EOS and stop_token_ids kept out) and bad_words (a word's last token after the rest of it) are masks on the
same path, ANDed with a grammar's; stop_token_ids end a sequence as EOS does.

Events go back to the handler's asyncio loop as ("token", id) (("token", Drawn) when the sequence
reports logprobs), ("prompt", scores), ("done", finish_reason) or ("error", RequestError); the scheduler finishes a
sequence at EOS, max_tokens or the end of its grammar, the handler by `cancel()` (a stop string, a
client gone).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from dataclasses import dataclass, field

import torch

from ..engine import StepHeld
from ..model.moe import long_tile_chunks, wave_tile_waves
from ..model.rows import short_chunk
from ..prefix import PrefixCache
from ..sampler import LogitsParams, Processing, SamplingParams
from ..speculative import NgramDrafter, padded
from .protocol import RequestError

# verify_graphs (DSV4_SERVE_VERIFY_GRAPHS=1; off: written in session 50 without a GPU): with graphs, a speculating
# sequence's verify steps replay a graph of its slot (replay.VerifyReplay, captured at the slot's first full step),
# the n-gram drafter's short proposals padded to draft_tokens (dsv4.speculative.padded: any drafts give the plain
# stream) so one graph serves every step; eager verify steps otherwise (~75-85 ms on a Flash rank, session 49).
CONFIG = {"verify_graphs": os.environ.get("DSV4_SERVE_VERIFY_GRAPHS", "0") == "1"}

log = logging.getLogger("dsv4.serve")

# Most tokens in one grouped prefill forward (states x chunk length): past it a length's group is split. It keeps
# the pair kernels' grids within CUDA's 65,535 (dsv4.kernels.moe: a program row per (token, expert) pair) and
# the forward's activations small; a sequence's chunks do not change, so neither do its bits.
PREFILL_GROUP_TOKENS = 2048


class QueueFull(Exception):
    """Every slot is busy and the waiting queue holds max_waiting sequences."""


@dataclass(eq=False)
class Sequence:
    prompt_ids: list[int]
    max_tokens: int
    sampling: object  # SamplingParams
    emit: object  # callable(event: tuple), thread-safe: delivers to the handler
    arrived: float = field(default_factory=time.perf_counter)
    slot: int | None = None
    prefilled: int = 0  # prompt tokens (of prompt_ids[:-1]) already in the state
    token: int | None = None  # the next step's input: the last prompt token, then each sampled one
    generated: int = 0
    last_emit: float | None = None
    cancelled: bool = False
    ignore_eos: bool = False  # sample through EOS up to max_tokens (vLLM's ignore_eos)
    logits: LogitsParams | None = None  # logit processing and logprobs on the device; None: the plain sampler
    constraint: object = None  # a grammar.Constraint (response_format): the allowed tokens of each step
    stop_ids: frozenset = frozenset()  # vLLM's stop_token_ids: a token of these ends the sequence ("stop")
    allowed: object = None  # vLLM's allowed_token_ids: a fixed bitmask (grammar.token_mask) of every step
    min_tokens: int = 0  # vLLM's min_tokens: the first ones drawn under `min_mask` (EOS and the stop ids out)
    min_mask: object = None
    bad_words: object = None  # vLLM's bad_words: a grammar.BadWords, its mask from the tokens drawn (`history`)
    prompt_logprobs: int | None = None  # echoed prompt logprobs: its prefill scores each prompt token (and this top)
    inflight: int = 0  # pipelined steps launched for this sequence and not settled yet (0 or 1)
    history: list = field(default_factory=list)  # the tokens drawn (kept where the n-gram drafter or bad_words read them)
    drafts: tuple = ()  # the MTP layer's drafts for the step after `drafted_at` tokens
    drafted_at: int = -1
    cached: int | None = None  # prompt tokens the prefix cache gave (None: not looked up yet)
    marks: tuple = ()  # where its prefill offers the prefix cache a snapshot (dsv4.prefix.Match.marks)
    leader: "Sequence | None" = None  # a sequence prefilling a prompt that shares ours, whose state we copy
    follow_at: int = 0  # ... when its prefill reaches this many tokens
    followers: list = field(default_factory=list)  # sequences waiting for this one's prefill to reach their prefix

    def cancel(self):
        """Ask the scheduler to drop this sequence at its next round (any thread)."""
        self.cancelled = True

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.prompt_ids) - 1

    @property
    def plain(self) -> bool:
        """This step needs no processing (no logit processing, no mask): the plain batched step (or a verify step)."""
        return (self.logits is None and self.constraint is None and self.allowed is None and self.bad_words is None
                and self.generated >= self.min_tokens)

    def processing(self) -> Processing | None:
        """This step's processing of the sequence's row (the grammar's mask filled now, and with it those of
        allowed_token_ids, min_tokens and bad_words: a token passes every one), None without any."""
        if self.plain:
            return None
        masks = [m for m in (None if self.constraint is None else self.constraint.mask(), self.allowed,
                             self.min_mask if self.generated < self.min_tokens else None,
                             None if self.bad_words is None else self.bad_words.mask(self.history))
                 if m is not None]
        mask = None
        for m in masks:
            mask = m.clone() if mask is None else mask.bitwise_and_(m)
        first = self.generated == 0  # the counts restart from the prompt when the sequence enters its slot
        return Processing(self.logits or LogitsParams(), tuple(self.prompt_ids) if first else None, mask)


def _state_budget(model, max_num_seqs: int, prefix_cache: int, max_model_len: int) -> str:
    """What the slots and the prefix cache will hold (whole decode states of max_model_len tokens, allocated at
    start), as the sentence an error gives; refused before a byte is allocated where the memory this process can see
    cannot hold it: one device (a GPU's free memory) or the host (CPU ranks together). Several GPUs' ranks are each
    their own device, seen by them alone: there running out of memory while allocating says the same."""
    from ..checkpoint.memory import available_bytes
    from ..state import state_bytes

    each = state_bytes(model.cfg, max_model_len, model.dtype)
    states = max_num_seqs + prefix_cache
    need = states * each * (model.world if model.device.type == "cpu" else 1)
    gib = lambda n: f"{n / 2**30:,.2f} GiB"  # noqa: E731
    budget = (f"the server's states do not fit: {max_num_seqs} slots (--max-num-seqs) + {prefix_cache} prefix "
              f"states (--prefix-cache), each a decode state of {max_model_len:,} tokens (--max-model-len), "
              f"{gib(each)} a rank: {gib(states * each)} a rank; lower one of them")
    if model.device.type == "cpu" or model.world == 1:
        free, what = available_bytes(model.device)
        if need > free:
            raise ValueError(f"{budget} ({gib(need)} needed, {gib(free)} {what})")
    return budget


class Scheduler:
    def __init__(self, model, max_num_seqs: int = 16, max_model_len: int = 8192, max_waiting: int = 64,
                 prefill_chunk: int = 64, metrics=None, graphs: bool | None = None, pipelined: bool = True,
                 speculate: str | None = None, draft_tokens: int = 4, prefix_cache: int = 0):
        if max_num_seqs < 1 or max_waiting < 0 or prefill_chunk < 1:
            raise ValueError(f"max_num_seqs {max_num_seqs} >= 1, max_waiting {max_waiting} >= 0 and "
                             f"prefill_chunk {prefill_chunk} >= 1 are required")
        if not isinstance(prefix_cache, int) or isinstance(prefix_cache, bool) or prefix_cache < 0:
            raise ValueError(f"prefix_cache {prefix_cache!r}: the states the prefix cache keeps, an integer >= 0")
        if speculate not in (None, "ngram", "mtp") or not isinstance(draft_tokens, int) or draft_tokens < 1:
            raise ValueError(f"speculate {speculate!r} (None, 'ngram' or 'mtp') with draft_tokens {draft_tokens!r} "
                             ">= 1")
        # speculative decoding (dsv4.speculative) of a sequence that decodes alone: verify steps whose tokens are
        # the plain step's, bit for bit, so a sequence's stream does not change with it
        self.speculate, self.draft_tokens = speculate, draft_tokens
        self.ngram = NgramDrafter() if speculate == "ngram" else None
        if speculate and model.device.type == "cuda" and os.environ.get("DSV4_SPECULATIVE", "0") != "1":
            raise ValueError("speculate: the server's verify steps have not run on a GPU yet (the engine's have: "
                             "dsv4 gate --speculative); DSV4_SPECULATIVE=1 runs them anyway")
        self.model, self.max_waiting, self.prefill_chunk, self.metrics = model, max_waiting, prefill_chunk, metrics
        # The slots are the rows of one pool (dsv4.state.StatePool): a batched step over them runs each of
        # attention's, the compressors' and the indexer's kernels once for all rows where the pooled
        # kernels run (each slot is still byte for byte a fresh state of its own).
        budget = _state_budget(model, max_num_seqs, prefix_cache, max_model_len)
        model.each("pool_states", max_num_seqs)
        try:
            self.slots = [model.new_state(max_model_len) for _ in range(max_num_seqs)]
        except torch.OutOfMemoryError as e:
            raise ValueError(f"{budget}; the device ran out of memory allocating them ({str(e).splitlines()[0]})"
                             ) from None
        finally:
            model.each("pool_states", 0)
        if speculate == "mtp" and not self.slots[0].mtp_caches:
            raise ValueError("speculate 'mtp': the model was loaded without its MTP layer (dsv4.load(..., mtp=True))")
        # prefix caching (dsv4.prefix, off by default): a prompt that begins with a cached prompt's chunks starts
        # from their state; its chunk boundaries, so its bits and tokens, are the same as without it
        try:
            self.prefix = (PrefixCache(model, prefix_cache, max_model_len, prefill_chunk, drafted=speculate == "mtp")
                           if prefix_cache else None)
        except torch.OutOfMemoryError as e:
            raise ValueError(f"{budget}; the device ran out of memory allocating the prefix cache's "
                             f"({str(e).splitlines()[0]})") from None
        # graphs: one captured batched step per bucket (CUDA only; None: on CUDA)
        self.graphs = model.device.type == "cuda" if graphs is None else graphs
        self.pipelined = pipelined
        self.launched: list | None = None  # the rows (Sequence or None) of the step launched and not settled
        self.buckets = sorted({min(1 << i, max_num_seqs) for i in range(max_num_seqs.bit_length() + 1)})
        self.free = list(range(max_num_seqs))
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []
        self.cond = threading.Condition()
        self.stopping = False
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name="dsv4-scheduler", daemon=True)

    # ---- handler side (any thread) ------------------------------------------
    def submit(self, seq: Sequence):
        """Queue a sequence; raises QueueFull when it would wait behind max_waiting others."""
        with self.cond:
            if self.stopping or self.error is not None:
                raise RequestError("the server is shutting down" if self.stopping else
                                   f"the engine stopped: {self.error!r}", status=503, kind="server_error")
            waiting = sum(not s.cancelled for s in self.waiting)
            if waiting + 1 - len(self.free) > self.max_waiting:
                raise QueueFull
            self.waiting.append(seq)
            self.cond.notify()

    def wake(self):
        """Make a sleeping scheduler look at its sequences (after a cancel)."""
        with self.cond:
            self.cond.notify()

    def start(self):
        self.thread.start()

    def driven_inline(self):
        """A scheduler driven in its caller's thread (dsv4.generate_many), when it is done: its thread, never started,
        dropped. An unstarted Thread holds its target (self._loop, so self), a cycle that would leave the scheduler,
        its states and their CUDA graphs to the cycle collector, which may run inside a later graph capture: a
        graph destroyed there invalidates the capture (session 48 call 4). A started thread drops its target as it
        ends, so the server's scheduler needs none of this."""
        if self.thread.is_alive():
            raise RuntimeError("driven_inline: the scheduler's thread is running")
        self.thread = None

    def capture_buckets(self):
        """Capture every bucket's batched step now, with all rows inactive (nothing changes), so that no
        request pays a capture; the server calls it before it listens (CUDA only). Two graphs a bucket: rows
        without top_k / top_p (their step skips the kept-set sort) and rows with them (dsv4.sampler.restricts)."""
        if not self.graphs:
            return
        for size in self.buckets:
            for sampling in (None, SamplingParams(top_p=0.5)):
                self.model.step_batch(self.slots[:size], [0] * size, [sampling] * size, [False] * size, graph=True)

    def warm_prefill(self, tokens: int = 15):
        """Run prefill forwards of every slot, of two and of one (a short chunk each: the grouped path every short
        prompt takes; a wave of many rows also sums the shared expert's splits in a launch of its own), then zero
        the slots: the prefill kernels compile now, before the server listens, not in the first requests' time to
        first token (session 15 call 1: ~10 s of compiles across a server's first waves, moe_tc's plan 4.4 s of
        it). Other chunk lengths may still compile a variant or two (prefill attention rounds its tile counts to
        powers of two). Triton compiles a variant per integer argument divisible by 16 or not (a chunk's length, its
        rows): most chunks are not, so the grouped forwards take `tokens` (15), the single one tokens + 1. Then the
        waves of moe_tc's wave tiles the forwards here do not take (dsv4.model.moe.wave_tile_waves), then the first
        slot's chunks of 31 / 32, 63 / 64 and 127 / 128 tokens (the geometry kernels of a short chunk compile
        once per power of two of its length), then its long chunks, two for each of moe_tc's long tile shapes that a
        chunk of this server reaches (dsv4.model.moe.long_tile_chunks). The slots' bytes are a fresh state's after."""
        # The first slot takes the three forwards in turn (3 * tokens + 1 positions): a server of fewer tokens a
        # sequence warms with shorter chunks (none below 1).
        tokens = min(tokens, (self.slots[0].capacity - 1) // 3)
        if tokens < 1:
            return
        ids = lambda n: [t % self.model.cfg.vocab_size for t in range(1, n + 1)]  # noqa: E731
        most = self.slots[:max(1, PREFILL_GROUP_TOKENS // tokens)]
        grouped = [(size, tokens + (size == 1)) for size in sorted({len(most), min(2, len(most)), 1}, reverse=True)]
        try:
            for size, n in grouped:
                self.model.prefill_batch(most[:size], [ids(n)] * size)
        finally:
            for state in most:
                state.discard()
        # A grouped wave's routed experts take moe_tc's tiles by its pairs an expert (the wave tiles): a wave for
        # each tile shape this server's waves reach that the forwards here do not (a concurrency-16 server's 16 x
        # 63 wave on mini takes 32-row tiles; a first one compiled them in its time to first token).
        longest = min(self.prefill_chunk, self.slots[0].capacity - 1)
        short = [n for p in (32, 64, 128) for n in (p - 1, p) if n <= longest]
        for size, n in wave_tile_waves(self.model.cfg, len(self.slots), longest, PREFILL_GROUP_TOKENS,
                                       grouped + [(1, n) for n in short]):
            try:
                self.model.prefill_batch(self.slots[:size], [ids(n)] * size)
            finally:
                for state in self.slots[:size]:
                    state.discard()
        # A short chunk's geometry kernels compile once per power of two of its length up to 128 (dsv4.kernels.
        # geometry chunks), other kernels once per length divisible by 16 or not: a chunk of each (15, 16 ran above).
        # A long prompt's chunks take moe_tc's long tiles, a shape per pairs an expert: their compiles too (session
        # 22 call 1: a first 4,096-token prefill on mini 14.4 s, the next ones 0.17). One slot at a time.
        first = self.slots[0]
        for n in short + long_tile_chunks(self.model.cfg, longest):
            try:
                self.model.prefill_batch([first], [ids(n)])
            finally:
                first.discard()

    def stop(self, timeout: float = 30.0):
        with self.cond:
            self.stopping = True
            self.cond.notify()
        if self.thread.is_alive():
            self.thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self.thread.is_alive() and self.error is None

    def counts(self) -> tuple[int, int]:
        """(running, waiting)."""
        with self.cond:
            return len(self.running), len(self.waiting)

    # ---- the scheduler thread ------------------------------------------------
    def _loop(self):
        try:
            if self.model.device.type == "cuda":
                import torch

                if self.model.device.index is not None:  # "cuda" alone is the current device already
                    torch.cuda.set_device(self.model.device)  # a new thread starts on cuda:0
            while self._admit():
                self._round()
        except BaseException as e:  # noqa: BLE001 - the engine is unusable; tell every handler why
            log.exception("dsv4 scheduler stopped")
            self.error = e
        with self.cond:
            left = [*self.running, *self.waiting]
            self.running, self.waiting = [], collections.deque()
        for seq in left:
            seq.emit(("error", RequestError("the server is shutting down" if self.error is None else
                                            f"the engine stopped: {self.error!r}", status=503, kind="server_error")))
        self._gauge()

    def _admit(self) -> bool:
        """Move waiting sequences into free slots; sleep while there is nothing to do. False: stop."""
        with self.cond:
            while not self.stopping and not self.running and not self.waiting:
                self.cond.wait()
            if self.stopping:
                return False
            if any(s.cancelled for s in self.waiting):
                self.waiting = collections.deque(s for s in self.waiting if not s.cancelled)
            while self.waiting and self.free:
                seq = self.waiting.popleft()
                self.free.sort(reverse=True)
                seq.slot = self.free.pop()  # the lowest free slot: the batch's bucket stays small
                if self.metrics is not None:
                    self.metrics.queued(time.perf_counter() - seq.arrived)
                seq.token = seq.prompt_ids[-1]
                self.running.append(seq)
        self._gauge()
        return True

    def _round(self):
        self._lookup([s for s in self.running if not s.cancelled and s.cached is None])
        prefilling = [s for s in self.running if not s.cancelled and s.prefilling and s.leader is None]
        if prefilling:
            # settle the launched step first: its tokens go out now, not after the prefill (a long forward that
            # waits for the device anyway, so nothing is left to overlap)
            self._drain()
        self._prefill(prefilling)
        self._decode([s for s in self.running if not s.cancelled and not s.prefilling])
        # a cancelled sequence keeps its slot while a launched step still writes its state
        done = [s for s in self.running if s.cancelled and not s.inflight]
        for seq in done:
            self._zero(seq)
        if done:
            with self.cond:
                self.running = [s for s in self.running if not s.cancelled]
                self.free += [s.slot for s in done]
            self._gauge()

    def _lookup(self, seqs: list[Sequence]):
        """New sequences' prompts in the prefix cache: a cached prefix restored into the slot (its prefill goes on
        from there), and where each prefill should offer the cache a snapshot. A sequence sharing more of its prompt
        with one that is prefilling now (a system prompt of a burst of requests, a request's n choices) follows that
        one instead: it copies its state when that prefill reaches their shared prefix (_hand_over), the bytes its own
        prefill would leave there: a chunk boundary of both, or, for the same prompt, its end."""
        for seq in self.running:  # the followers of a leader that ended before the hand-over: looked up again
            if seq.leader is not None and seq.leader.cancelled and not seq.cancelled:
                seq.leader = None
                seqs.append(seq)
        for seq in seqs:
            if self.prefix is None or seq.prompt_logprobs is not None:  # a scored prompt runs its own prefill whole
                seq.cached = 0
                continue
            match = self.prefix.match(seq.prompt_ids)
            leader, at = self._leader(seq)
            if leader is not None and at > match.tokens:
                seq.leader, seq.follow_at, seq.cached, seq.marks = leader, at, 0, match.marks
                leader.followers.append(seq)
                if at % self.prefill_chunk == 0:  # where the leader goes on, a snapshot for later prompts too
                    leader.marks = tuple(sorted({*leader.marks, at}))
                if self.metrics is not None:
                    self.metrics.prefix_cached(len(seq.prompt_ids) - 1, 0)
                if leader.prefilled == at:  # there already: its snapshot and this one's copy now
                    self._offer(leader)
                    self._hand_over(leader)
                continue
            try:
                self.prefix.restore(self.slots[seq.slot], match)
            except Exception as e:  # noqa: BLE001 - the copy failed: this sequence fails, others go on
                self._failed([seq], e)
                continue
            seq.cached = seq.prefilled = match.tokens
            seq.marks = match.marks
            if self.metrics is not None:
                self.metrics.prefix_cached(len(seq.prompt_ids) - 1, match.tokens)

    def _leader(self, seq: Sequence) -> tuple[Sequence | None, int]:
        """The prefilling sequence whose state will hold the most of `seq`'s prefill, and how many tokens: their
        shared prompt's last chunk boundary (with the MTP layer's window, the token there shared too), or the whole
        prefill of the same prompt; only a sequence not past it yet."""
        best, most = None, 0
        n = len(seq.prompt_ids) - 1
        for s in self.running:
            if s is seq or s.leader is not None or s.cancelled or s.cached is None or not s.prefilling:
                continue
            if s.prompt_ids == seq.prompt_ids:
                at = n
            else:
                shared = next((i for i, (a, b) in enumerate(zip(s.prompt_ids, seq.prompt_ids)) if a != b),
                              min(len(s.prompt_ids), len(seq.prompt_ids)))
                limit = min(shared - (self.speculate == "mtp"), n, len(s.prompt_ids) - 1)
                at = max(0, limit) // self.prefill_chunk * self.prefill_chunk
            if at > most and s.prefilled <= at:
                best, most = s, at
        return best, most

    def _hand_over(self, seq: Sequence):
        """The sequences following `seq` whose shared prefix its prefill has reached take a copy of its state. One
        whose point its prefill stepped over, or ended before (neither should happen: both prompts are chunked from
        0, and a point is a chunk boundary or the end), is looked up again rather than given other bytes."""
        waiting = []
        for f in seq.followers:
            if f.cancelled:
                continue
            if f.follow_at > seq.prefilled and seq.prefilling:
                waiting.append(f)
                continue
            if f.follow_at != seq.prefilled:
                f.leader, f.cached = None, None
                continue
            try:
                self.slots[f.slot].restore(self.slots[seq.slot])
            except Exception as e:  # noqa: BLE001 - the copy failed: this follower fails, others go on
                self._failed([f], e)
                continue
            f.leader, f.cached = None, seq.prefilled
            f.prefilled = seq.prefilled
            f.marks = tuple(m for m in f.marks if m > f.prefilled)
            if self.metrics is not None:
                self.metrics.prefix_cached(0, f.cached)
        seq.followers = waiting

    def _offer(self, seq: Sequence):
        """A snapshot of the sequence's state for the prefix cache, where its prefill reached one of its marks."""
        if self.prefix is None or seq.prefilled not in seq.marks:
            return
        try:
            self.prefix.offer(seq.prompt_ids, seq.prefilled, self.slots[seq.slot])
        except Exception:  # noqa: BLE001 - a copy that failed leaves no entry; the sequence itself is untouched
            log.exception("dsv4 serve: the prefix cache could not keep a snapshot")

    def _prefill(self, seqs: list[Sequence]):
        """The next prefill chunk of each sequence: the short chunks of one length in one forward, each longer
        one in its own (dsv4.model.rows.short_chunk). A group that fails fails its sequences alone."""
        for group in self._prefill_groups(seqs):
            states, chunks = [self.slots[s.slot] for s, _ in group], [c for _, c in group]
            try:
                if group[0][0].prompt_logprobs is not None:  # alone (_prefill_groups): its rows scored too
                    seq, chunk = group[0]
                    targets = seq.prompt_ids[seq.prefilled + 1:seq.prefilled + 1 + len(chunk)]
                    seq.emit(("prompt", self.model.prefill_scored(states[0], chunk, targets, seq.prompt_logprobs)))
                elif self.speculate == "mtp":  # the MTP layer's window over each chunk too (the same prefill bits)
                    nexts = [s.prompt_ids[s.prefilled + len(c)] for s, c in group]
                    self.model.prefill_batch_drafted(states, chunks, nexts)
                else:
                    self.model.prefill_batch(states, chunks)
            except Exception as e:  # noqa: BLE001 - a refused forward: its sequences fail, others go on
                self._failed([s for s, _ in group], e)
                continue
            for seq, chunk in group:
                seq.prefilled += len(chunk)
                self._offer(seq)
                if seq.followers:
                    self._hand_over(seq)

    def _prefill_groups(self, seqs: list[Sequence]) -> list[list[tuple[Sequence, list[int]]]]:
        """(sequence, next chunk) pairs by forward: short chunks of one length together, at most
        PREFILL_GROUP_TOKENS tokens a forward; a longer chunk alone. A chunk's bounds are its own prompt's."""
        by_length: dict[object, list[tuple[Sequence, list[int]]]] = {}
        for seq in seqs:
            start = seq.prefilled
            chunk = seq.prompt_ids[start:min(start + self.prefill_chunk, len(seq.prompt_ids) - 1)]
            alone = not short_chunk(len(chunk)) or seq.prompt_logprobs is not None
            by_length.setdefault(seq if alone else len(chunk), []).append((seq, chunk))
        groups = []
        for same in by_length.values():
            most = max(1, PREFILL_GROUP_TOKENS // len(same[0][1]))
            groups += [same[i:i + most] for i in range(0, len(same), most)]
        return groups

    def _decode(self, seqs: list[Sequence]):
        """One batched step for every decoding sequence: eager over their own slots, or the graph of
        the smallest bucket of slots that holds them all; pipelined, launched before the previous step
        settles. With speculate, a sequence decoding alone (without logit processing or a grammar) takes a verify
        step instead (_speculate), unless the n-gram drafter has nothing to propose: then the batched step."""
        alone = seqs[0] if len(seqs) == 1 else None
        # a scored prompt's prefill skipped the MTP window (prefill_scored): its sequence does not speculate
        if self.speculate and alone and alone.plain and alone.prompt_logprobs is None:
            self._drain()  # its launched batched step first: the verify step continues from its state
            if seqs[0].cancelled or self._speculate(seqs[0]):
                return
        if self.pipelined and all(s.plain for s in seqs):
            self._decode_pipelined(seqs)
            return
        self._drain()
        seqs = [s for s in seqs if not s.cancelled]
        if not seqs:
            return
        rows, states = self._rows(seqs)
        tokens = [0 if s is None else s.token for s in rows]
        samplings = [None if s is None else s.sampling for s in rows]
        active = [s is not None for s in rows]
        try:
            processing = [None if s is None else s.processing() for s in rows]
            if any(p is not None for p in processing):
                out = self.model.step_batch_processed(states, tokens, samplings, processing, active, graph=self.graphs)
            else:
                out = self.model.step_batch(states, tokens, samplings, active, graph=self.graphs)
        except Exception as e:  # noqa: BLE001 - a refused step: every sequence in it fails, others go on
            self._failed(seqs, e)
            return
        for seq, token in zip(rows, out):
            if seq is not None:
                self._guarded(seq, lambda s: self._took(s, token))

    def _speculate(self, seq: Sequence) -> bool:
        """One verify step of a sequence decoding alone: its drafts (the n-gram drafter's, or the MTP layer's from
        its last verify step, if no other step ran since), at most what max_tokens and the slot leave; its tokens
        taken one by one as a plain step's (EOS, max_tokens and cancels end it as ever; the verify step commits
        nothing past an EOS). -> False, with nothing done, where the n-gram drafter proposes nothing: a verify step
        of no drafts is the plain step, which the batched step (its graph) makes faster."""
        state = self.slots[seq.slot]
        room = max(0, min(self.draft_tokens, seq.max_tokens - seq.generated - 1, state.capacity - state.host_pos - 1))
        # a graph per slot (CONFIG verify_graphs; full steps only, the last ones of a budget run eagerly) holds a
        # verify step's activations for each slot that speculated
        graph = self.graphs and CONFIG["verify_graphs"]
        stops = tuple(seq.stop_ids) + (() if seq.ignore_eos else (self.model.cfg.eos_token_id,))
        try:
            if self.speculate == "mtp":
                drafts = list(seq.drafts)[:room] if seq.drafted_at == seq.generated else []
                got, drafted = self.model.verify_draft(state, seq.token, drafts, seq.sampling, stops, self.draft_tokens,
                                                       graph=graph and len(drafts) == self.draft_tokens)
            else:
                drafts = self.ngram.propose(seq.prompt_ids + seq.history, room)[:room]
                if not drafts:
                    return False
                if graph and len(drafts) < room == self.draft_tokens:
                    drafts = padded(drafts, room, seq.token)
                got = self.model.verify(state, seq.token, drafts, seq.sampling, stops,
                                        graph=graph and len(drafts) == self.draft_tokens)
        except Exception as e:  # noqa: BLE001 - a refused step: this sequence fails, others go on
            self._failed([seq], e)
            return True
        if self.metrics is not None:
            self.metrics.speculated(len(drafts), len(got) - 1)
        for token in got:
            if seq.cancelled:
                break
            self._guarded(seq, lambda s: self._took(s, token))
        if self.speculate == "mtp":
            seq.drafts, seq.drafted_at = drafted, seq.generated
        return True

    def _rows(self, seqs: list[Sequence]) -> tuple[list, list]:
        """A step's rows (a Sequence, or None for a free slot of the bucket) and their states."""
        if self.graphs:
            size = next(b for b in self.buckets if b > max(s.slot for s in seqs))
            by_slot = {s.slot: s for s in seqs}
            rows = [by_slot.get(i) for i in range(size)]
            states = self.slots[:size]
        else:
            rows, states = list(seqs), [self.slots[s.slot] for s in seqs]
        return rows, states

    def _decode_pipelined(self, seqs: list[Sequence]):
        """Launch this round's step, then settle the previous one (its tokens handled while this one runs)."""
        launch = [s for s in seqs if s.generated + s.inflight < s.max_tokens]
        previous, self.launched = self.launched, None
        if launch:
            rows, states = self._rows(launch)
            # a row whose sequence has drawn a token takes it on the device; a new one its last prompt token
            feed = [s is not None and s.generated + s.inflight > 0 for s in rows]
            tokens = [None if s is None or f else s.token for s, f in zip(rows, feed)]
            try:
                self.model.step_batch_launch(states, tokens, [None if s is None else s.sampling for s in rows],
                                             [s is not None for s in rows], feed, graph=self.graphs)
            except Exception as e:  # noqa: BLE001 - refused before it ran (a bad state): its sequences fail
                self._failed(launch, e)
            else:
                for s in launch:
                    s.inflight += 1
                self.launched = rows
        if previous is not None and not self._settle(previous):
            self._drain()  # launched behind a refusal: held; settled now, so the next launch feeds from the host

    def _settle(self, rows: list) -> bool:
        """Take a launched step's tokens; a refused step fails its sequences (-> False), a held one is run again."""
        seqs = [s for s in rows if s is not None]
        for s in seqs:
            s.inflight -= 1
        try:
            out = self.model.step_batch_settle()
        except StepHeld:
            return True  # nothing committed: each sequence's next round launches the same step again
        except Exception as e:  # noqa: BLE001 - a refused step: every sequence in it fails, others go on
            self._failed([s for s in seqs if not s.cancelled], e)
            return False
        for seq, token in zip(rows, out):
            if seq is not None and not seq.cancelled:  # a sequence that ended meanwhile drops its extra token
                self._guarded(seq, lambda s: self._took(s, token))
        return True

    def _drain(self):
        """Settle the launched step, if any (before an unpipelined step, or when the loop stops)."""
        previous, self.launched = self.launched, None
        if previous is not None:
            self._settle(previous)

    def _took(self, seq: Sequence, drawn):
        """drawn: the token (a plain step) or its Drawn (a processed one)."""
        seq.token = getattr(drawn, "token", drawn)
        seq.generated += 1
        if self.ngram is not None or seq.bad_words is not None:
            seq.history.append(seq.token)
        self._observe(seq)
        seq.emit(("token", drawn if seq.logits is not None and seq.logits.logprobs is not None else seq.token))
        if seq.constraint is not None:
            seq.constraint.accept(seq.token)
        if seq.constraint is not None and seq.constraint.terminated:
            self._finish(seq, "stop")
        elif seq.token == self.model.cfg.eos_token_id and not seq.ignore_eos or seq.token in seq.stop_ids:
            self._finish(seq, "stop")
        elif seq.generated >= seq.max_tokens:
            self._finish(seq, "length")

    def _guarded(self, seq: Sequence, work):
        """Run one unit of a sequence's work; an engine error ends that sequence alone."""
        try:
            work(seq)
        except Exception as e:  # noqa: BLE001 - a refused step or a bad state: this request fails, others go on
            self._failed([seq], e)

    def _failed(self, seqs: list[Sequence], e: Exception):
        """End the sequences of a failed forward (an engine error), each with a 500."""
        log.warning("dsv4 serve: a forward failed for %d sequence(s): %r", len(seqs), e)
        for seq in seqs:
            seq.emit(("error", RequestError(f"the engine failed this request: {e}", status=500,
                                            kind="server_error")))
            seq.cancel()

    def _finish(self, seq: Sequence, reason: str):
        seq.emit(("done", reason))
        seq.cancel()

    def _zero(self, seq: Sequence):
        state = self.slots[seq.slot]
        if state.host_pos or state.quarantine is not None:
            state.discard()  # zeroed: the next sequence starts from a fresh state's bytes

    # ---- metrics -------------------------------------------------------------
    def _observe(self, seq: Sequence):
        if self.metrics is None:
            return
        t = time.perf_counter()
        if seq.last_emit is None:
            self.metrics.first_token(t - seq.arrived, len(seq.prompt_ids))
        else:
            self.metrics.next_token(t - seq.last_emit)
        seq.last_emit = t

    def _gauge(self):
        if self.metrics is not None:
            self.metrics.queues(*self.counts())
