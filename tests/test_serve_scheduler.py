"""The serving scheduler without HTTP, on the tiny preset (CPU).

Checked: sequences run together give, token for token, what each gives alone (`Model.sample_tokens`,
sampled with its seed), slots reused after others included; a long prompt is prefilled in chunks
while a running sequence keeps decoding; a cancelled sequence frees its slot; a full waiting
queue refuses; a round's short prefill chunks of one length run in one forward (Model.prefill_batch),
each sequence's tokens equal to alone, and a refused grouped prefill fails its sequences alone.
"""

from __future__ import annotations

import queue
import random
import threading
import time

import pytest
import torch

import dsv4
from dsv4.serve.scheduler import QueueFull, Scheduler, Sequence
from dsv4.speculative import ScriptedDrafter


@pytest.fixture(scope="module")
def model():
    return dsv4.load("tiny", device="cpu", dtype=torch.float32)


def run(sched, seqs, timeout=120):
    """Submit `seqs` (list of (ids, max_tokens, sampling)); return each one's tokens and the event log."""
    log, done, out = [], threading.Event(), [[] for _ in seqs]
    left = [len(seqs)]
    lock = threading.Lock()

    def emitter(i):
        def emit(event):
            with lock:
                log.append((i, *event))
                if event[0] == "token":
                    out[i].append(event[1])
                else:
                    left[0] -= 1
                    if not left[0]:
                        done.set()
        return emit

    with sched.cond:  # every one queued before the scheduler admits any
        for i, (ids, n, sampling) in enumerate(seqs):
            sched.submit(Sequence(list(ids), n, sampling, emitter(i)))
    assert done.wait(timeout), "the scheduler did not finish"
    return out, log


def served(sched, seqs):
    """run() on a scheduler started for it and stopped after: each sequence's tokens."""
    sched.start()
    try:
        return run(sched, seqs)[0]
    finally:
        sched.stop()


def solo(model, ids, n, sampling):
    out = []
    for t in model.sample_tokens(ids, n, sampling):
        out.append(t)
        if t == model.cfg.eos_token_id:
            break
    return out


def test_together_equals_alone(model, monkeypatch):
    tok = model.tokenizer
    sizes = []
    step_batch_launch = model.step_batch_launch

    def counted(states, *args, **kwargs):  # the real (pipelined) batched step, its row counts recorded
        sizes.append(len(states))
        return step_batch_launch(states, *args, **kwargs)

    monkeypatch.setattr(model, "step_batch_launch", counted)
    jobs = [(tok.encode("the river starts high in the hills " * 11), 10, dsv4.SamplingParams(seed=1)),  # 3 chunks
            (tok.encode("hello"), 14, dsv4.SamplingParams(temperature=0.8, top_p=0.9, seed=2)),
            (tok.encode("numbers have their own small poetry"), 12, dsv4.SamplingParams(top_k=20, seed=3)),
            ([tok.bos_id], 8, dsv4.SamplingParams.greedy())]  # a one-token prompt: no prefill at all
    assert len(jobs[0][0]) > 2 * 64
    expected = [solo(model, *j) for j in jobs]
    sched = Scheduler(model, max_num_seqs=3, max_model_len=256, max_waiting=8, prefill_chunk=64)
    sched.start()
    try:
        for _ in range(2):  # the second pass runs on reused (zeroed) slots
            got, log = run(sched, jobs)
            assert got == expected
        assert max(sizes) == 3  # every slot decoded in one batched step
        # The long prompt's chunks did not stall the others: the short ones sampled before its first token.
        first_long = next(k for k, e in enumerate(log) if e[0] == 0 and e[1] == "token")
        assert sum(1 for e in log[:first_long] if e[0] == 1 and e[1] == "token") >= 2
    finally:
        sched.stop()


def test_cancel_frees_the_slot_and_a_full_queue_refuses(model):
    sched = Scheduler(model, max_num_seqs=1, max_model_len=256, max_waiting=1)
    sched.start()
    events = queue.Queue()
    try:
        long = Sequence(model.tokenizer.encode("hi"), 200, dsv4.SamplingParams(seed=4), events.put)
        sched.submit(long)
        assert events.get(timeout=30)[0] == "token"  # running: the one slot is taken
        waiting = Sequence(model.tokenizer.encode("hey"), 2, dsv4.SamplingParams(seed=5), lambda e: None)
        sched.submit(waiting)
        with pytest.raises(QueueFull):
            sched.submit(Sequence([1, 2], 2, dsv4.SamplingParams(), lambda e: None))
        waiting.cancel()
        long.cancel()
        sched.wake()
        got, _ = run(sched, [(model.tokenizer.encode("next"), 3, dsv4.SamplingParams(seed=6))], timeout=30)
        assert len(got[0]) >= 1
        deadline = time.monotonic() + 10  # "done" is sent inside the round; the slot is freed at its end
        while sched.counts() != (0, 0) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sched.counts() == (0, 0)
        assert len(sched.free) == 1 and sched.slots[0].host_pos == 0  # released and zeroed
    finally:
        sched.stop()


def test_text_stream_releases_the_whole_text(model):
    """TextStream's deltas join to tokenizer.decode of all the tokens (multi-byte characters split
    across tokens included), cut before the first stop string."""
    from dsv4.serve.protocol import TextStream

    tok, rng = model.tokenizer, random.Random(0)
    texts = ["日本語のテキスト and 中文 mixed ✓ émojis 🎉🎉", "plain words only here"]
    for trial in range(200):
        ids = (tok.encode(rng.choice(texts), add_bos=False) if trial % 3 == 0 else
               [rng.randrange(2, tok.vocab_size) for _ in range(rng.randrange(1, 40))])
        full = tok.decode(ids)
        stop = [full[3:5]] if trial % 2 and len(full) > 6 and full[3:5].strip() else []
        stream, got = TextStream(tok, model.cfg.eos_token_id, stop), ""
        for t in ids:
            got += stream.push(t)
            if stream.finish:
                break
        got += "" if stream.finish else stream.end("length")
        assert got == (full[:full.find(stop[0])] if stop else full), (trial, ids, stop)


def test_slots_are_one_pool_and_two_ranks_equal_alone(model):
    """The slots are the rows of one StatePool (so a batched step runs the pooled kernels where they run),
    and on two ranks (gloo) sequences together equal each alone, as on one, after the server's warm-up too (its
    forwards and zeroing on every rank's slots)."""
    from dsv4.state import pool_of

    sched = Scheduler(model, max_num_seqs=3, max_model_len=64)
    assert pool_of(sched.slots) is not None
    assert pool_of([model.new_state(64)]) is None  # the model hands out plain states again
    two = dsv4.load("tiny", device="cpu", dtype=torch.float32, ranks=2)
    try:
        tok = two.tokenizer
        jobs = [(tok.encode("a small river"), 6, dsv4.SamplingParams(seed=4)),
                (tok.encode("hello there"), 8, dsv4.SamplingParams(temperature=0.9, seed=5))]
        expected = [solo(two, *j) for j in jobs]
        assert served(Scheduler(two, max_num_seqs=2, max_model_len=64), jobs) == expected
        warmed = Scheduler(two, max_num_seqs=2, max_model_len=64)
        warmed.warm_prefill()
        assert served(warmed, jobs) == expected
    finally:
        two.close()


def grouped_jobs(model):
    """Prompts of 21, 30 and 13 tokens (prefills of 20, 29, 12: chunks 8+8+4, 8+8+8+5, 8+4 at prefill_chunk 8) and
    a one-token prompt (no prefill)."""
    ids = lambda n, s: [(s * 31 + 7 * j) % 500 + 2 for j in range(n)]  # noqa: E731
    return [(ids(21, 1), 6, dsv4.SamplingParams(seed=11)), (ids(30, 2), 5, dsv4.SamplingParams(temperature=0.8, seed=12)),
            (ids(13, 3), 7, dsv4.SamplingParams.greedy()), ([5], 6, dsv4.SamplingParams(seed=14))]


def counted_prefills(model, monkeypatch, refuse_first_group=False, refuse=None):
    """Record the states of each prefill_batch call; optionally refuse the first one of several states, or the call
    where refuse(the sizes so far, this one's last) holds."""
    sizes = []
    real = model.prefill_batch

    def prefill_batch(states, chunks):
        sizes.append(len(states))
        if (refuse is not None and refuse(sizes)) or (refuse_first_group and len(states) > 1
                                                      and all(n == 1 for n in sizes[:-1])):
            model.arm_refusal(0, 0, 5, "moe")
            try:
                return real(states, chunks)
            finally:
                model.reset_refusals()
        return real(states, chunks)

    monkeypatch.setattr(model, "prefill_batch", prefill_batch)
    return sizes


def test_short_chunks_of_one_length_prefill_together_and_equal_alone(model, monkeypatch):
    """Each round's prefill chunks of one length run in one forward (Model.prefill_batch); every sequence's
    tokens equal its tokens alone through the same scheduler (the same chunk boundaries)."""
    jobs = grouped_jobs(model)
    sched = Scheduler(model, max_num_seqs=4, max_model_len=64, prefill_chunk=8)
    sched.start()
    try:
        expected = [run(sched, [j])[0][0] for j in jobs]
        sizes = counted_prefills(model, monkeypatch)
        got, _ = run(sched, jobs)
    finally:
        sched.stop()
    assert got == expected
    # 9 chunks in 6 forwards: round 1 the three 8-token chunks, round 2 two of 8 and one of 4, then 4 | 8, then 5.
    assert sizes == [3, 2, 1, 1, 1, 1]


def test_warm_prefill_leaves_fresh_slots_and_the_same_tokens(model, monkeypatch):
    """warm_prefill (the server's compile warm-up, before it listens) runs prefill forwards of every slot, of two
    and of one, then leaves every slot's committed bytes those of before (a fresh state's), and sequences served
    after give the tokens they give on a scheduler that never warmed."""
    jobs = grouped_jobs(model)
    expected = served(Scheduler(model, max_num_seqs=4, max_model_len=64, prefill_chunk=8), jobs)
    sched = Scheduler(model, max_num_seqs=4, max_model_len=64, prefill_chunk=8)
    before = [[t.clone() for _, t in slot.committed()] for slot in sched.slots]
    sizes = counted_prefills(model, monkeypatch)
    sched.warm_prefill()
    assert sizes == [4, 2, 1]  # every slot in one forward, then two, then one alone
    assert all(torch.equal(a, b) for slot, old in zip(sched.slots, before)
               for (_, a), b in zip(slot.committed(), old))
    assert all(slot.host_pos == 0 and slot.quarantine is None for slot in sched.slots)
    assert served(sched, jobs) == expected
    short = Scheduler(model, max_num_seqs=2, max_model_len=8)  # fewer tokens a sequence than the warm-up's chunks
    short.warm_prefill()
    assert all(slot.host_pos == 0 for slot in short.slots)


def warmed_lengths(model, monkeypatch, **options) -> list[list[int]]:
    """Warm a Scheduler(model, **options): the chunk lengths of each prefill forward its warm-up ran. Its slots are
    fresh after and it serves the tokens of a scheduler that never warmed."""
    jobs = grouped_jobs(model)
    expected = served(Scheduler(model, **options), jobs)
    sched = Scheduler(model, **options)
    lengths, real = [], model.prefill_batch
    monkeypatch.setattr(model, "prefill_batch", lambda states, chunks: (lengths.append([len(c) for c in chunks]),
                                                                        real(states, chunks))[1])
    sched.warm_prefill()
    monkeypatch.setattr(model, "prefill_batch", real)
    assert all(slot.host_pos == 0 and slot.quarantine is None for slot in sched.slots)
    assert all(not t.any() for slot in sched.slots for _, t in slot.committed())
    assert served(sched, jobs) == expected
    return lengths


def test_warm_prefill_runs_each_long_tile_shapes_chunks(model, monkeypatch):
    """A server whose prompts reach long chunks (prefill_chunk past the short chunks' 128 tokens) warms, after the
    short forwards, one slot's chunks of 31 to 128 tokens (a power of two and one less), then its long chunks (dsv4.model.moe.long_tile_chunks: tiny's 8 experts, 2 a token, reach
    moe_tc's last long tile shape at 192 tokens); its slots are fresh after and it serves the tokens of a
    scheduler that never warmed."""
    from dsv4.model.moe import long_tile_chunks

    lengths = warmed_lengths(model, monkeypatch, max_num_seqs=2, max_model_len=256, prefill_chunk=200)
    assert long_tile_chunks(model.cfg, 200) == [192, 191]
    # the short forwards, then a chunk a power of two (geometry's compiles) and its length less one, then the long
    assert lengths == [[15, 15], [16], [31], [32], [63], [64], [127], [128], [192], [191]]


@pytest.mark.parametrize("wave_tiles", [True, False], ids=["wave_tiles", "no_wave_tiles"])
def test_warm_prefill_runs_a_wave_for_each_wave_tile_shape(model, monkeypatch, wave_tiles):
    """With moe_tc's wave tiles (a grouped wave's experts in tiles by its pairs an expert), the warm-up runs a wave
    for each tile shape this server's waves reach and its other forwards do not: tiny (8 experts, 2 a token), 4
    slots of 32-token chunks: its 4 x 15 wave takes the 32-row tiles (15 pairs an expert), its single chunks the
    16-row ones (<= 12), so one wave of 4 x 32 (32 pairs: the 64-row tiles) is added; none without the wave tiles.
    Slots fresh after, the tokens of a scheduler that never warmed."""
    from dsv4.kernels import moe_tc

    monkeypatch.setitem(moe_tc.CONFIG, "wave_tiles", wave_tiles)
    lengths = warmed_lengths(model, monkeypatch, max_num_seqs=4, max_model_len=64, prefill_chunk=32)
    waves = [[32] * 4] if wave_tiles else []
    assert lengths == [[15] * 4, [15, 15], [16], *waves, [31], [32]]


def test_wave_tile_waves_reach_each_tile_once(monkeypatch):
    """wave_tile_waves on mini's experts (256, 6 a token) and a concurrency-32 server's 64-token chunks: the fewest
    sequences whose 64-token wave passes each tile's lower bound (12 and 24 pairs an expert: 9 and 17 sequences),
    none for a tile a done wave took, none past the slots or the tokens a forward takes, none without wave tiles."""
    from dsv4 import config
    from dsv4.kernels import moe_tc
    from dsv4.model.moe import wave_tile_waves

    monkeypatch.setitem(moe_tc.CONFIG, "wave_tiles", True)
    mini = config.preset("mini")
    done = [(32, 15), (2, 15), (1, 16)]  # 11.25, 0.7 and 0.375 pairs an expert: the 16-row tiles
    assert wave_tile_waves(mini, 32, 64, 2048, done) == [(9, 64), (17, 64)]
    assert wave_tile_waves(mini, 16, 64, 2048, done) == [(9, 64)]  # 17 sequences are past the slots
    assert wave_tile_waves(mini, 32, 64, 1024, done) == [(9, 64)]  # 17 x 64 tokens are past a forward's
    assert wave_tile_waves(mini, 32, 64, 2048, done + [(16, 63)]) == [(17, 64)]  # 23.6 pairs: the 32-row tiles
    assert wave_tile_waves(mini, 32, 500, 2048, done) == [(5, 128), (9, 128)]  # past 128 tokens: long chunks
    monkeypatch.setitem(moe_tc.CONFIG, "wave_tiles", False)
    assert wave_tile_waves(mini, 32, 64, 2048, done) == []


def test_a_refused_grouped_prefill_fails_its_sequences_alone(model, monkeypatch):
    """The first round's grouped prefill (three sequences) is refused: those three end with an error, nothing
    committed, their slots zeroed; the one-token prompt decoding beside them finishes as it does alone, and
    the next requests on the reused slots too."""
    jobs = grouped_jobs(model)
    sched = Scheduler(model, max_num_seqs=4, max_model_len=64, prefill_chunk=8)
    sched.start()
    try:
        expected = [run(sched, [j])[0][0] for j in jobs]
        sizes = counted_prefills(model, monkeypatch, refuse_first_group=True)
        got, log = run(sched, jobs)
        assert sizes == [3]
        errors = {i for i, kind, *rest in log if kind == "error"}
        assert errors == {0, 1, 2} and got[:3] == [[], [], []]
        assert "site moe" in str(next(e[2] for e in log if e[1] == "error"))
        assert got[3] == expected[3]
        again, _ = run(sched, jobs)
    finally:
        sched.stop()
    assert again == expected


def test_prefill_groups_split_by_length_and_size(model, monkeypatch):
    """Chunks group by length, at most PREFILL_GROUP_TOKENS tokens a forward; a chunk past the short limit goes
    alone; each chunk is its own prompt's next prefill_chunk tokens (the last prompt token is decode's)."""
    from dsv4.kernels import moe as fused_moe
    from dsv4.serve import scheduler

    sched = Scheduler(model, max_num_seqs=1, max_model_len=64, prefill_chunk=8)
    seqs = [Sequence(list(range(2, 2 + n)), 1, None, None) for n in (30, 5, 20, 12, 9, 30)]
    monkeypatch.setattr(scheduler, "PREFILL_GROUP_TOKENS", 16)
    groups = [[(seqs.index(s), len(c)) for s, c in g] for g in sched._prefill_groups(seqs)]
    assert groups == [[(0, 8), (2, 8)], [(3, 8), (4, 8)], [(5, 8)], [(1, 4)]]
    monkeypatch.setitem(fused_moe.CONFIG, "prefill_pair_tokens", 6)
    assert [[seqs.index(s) for s, _ in g] for g in sched._prefill_groups(seqs[:3])] == [[0], [1], [2]]


def _drive(sched, until, rounds=400):
    """Run the scheduler's rounds in this thread until `until()` holds."""
    for _ in range(rounds):
        if until():
            return
        sched._admit()
        sched._round()
    raise AssertionError("the scheduler did not get there")


def test_pipelined_rounds_drop_the_token_after_eos_and_free_the_slot_after(model, monkeypatch):
    """A sequence that draws EOS has its next step already launched: that token is dropped, its slot is freed
    once the step settled, and the next sequence on that slot equals itself alone. Unpipelined rounds give the
    same streams."""
    tok = model.tokenizer
    jobs = [(tok.encode("the quiet lake"), 9, dsv4.SamplingParams(seed=21)),
            (tok.encode("a long road"), 7, dsv4.SamplingParams(temperature=0.7, seed=22))]
    stream = solo(model, *jobs[0])
    monkeypatch.setattr(model.cfg, "eos_token_id", stream[3])  # job 0 now ends at its 4th token
    expected = [solo(model, *j) for j in jobs]
    assert expected[0] == stream[:4]
    for pipelined in (True, False):
        sched = Scheduler(model, max_num_seqs=1, max_model_len=64, pipelined=pipelined)
        got = [[] for _ in jobs]
        seqs = [Sequence(list(ids), n, sp, lambda e, i=i: got[i].append(e)) for i, (ids, n, sp) in enumerate(jobs)]
        for q in seqs:
            sched.submit(q)
        _drive(sched, lambda: not sched.running and not sched.waiting)
        assert [[e[1] for e in g if e[0] == "token"] for g in got] == expected, f"pipelined={pipelined}"
        assert [g[-1] for g in got] == [("done", "stop"), ("done", "length")]
        assert sched.launched is None and sched.free == [0] and sched.slots[0].host_pos == 0


def test_a_refusal_in_pipelined_rounds_fails_its_sequences_and_the_next_runs(model):
    """A decode step refuses while the next one is launched: its sequences end with the refusal's error (nothing
    committed; the step behind it held), the hold is lifted, and the next requests equal themselves alone."""
    tok = model.tokenizer
    jobs = [(tok.encode("one two"), 12, dsv4.SamplingParams(seed=31)), (tok.encode("three"), 12, dsv4.SamplingParams(seed=32))]
    sched = Scheduler(model, max_num_seqs=2, max_model_len=64)
    got = [[] for _ in jobs]
    seqs = [Sequence(list(ids), n, sp, lambda e, i=i: got[i].append(e)) for i, (ids, n, sp) in enumerate(jobs)]
    for q in seqs:
        sched.submit(q)
    _drive(sched, lambda: all(len(g) >= 3 for g in got))
    model.arm_refusal(2, 0, 9, "attention")
    try:
        _drive(sched, lambda: not sched.running)
    finally:
        model.reset_refusals()
    for g in got:
        assert g[-1][0] == "error" and "layer 2 site attention" in str(g[-1][1])
        assert all(e[0] == "token" for e in g[:-1])
    assert not bool(model.hold) and sched.launched is None
    assert all(s.host_pos == 0 and s.quarantine is None for s in sched.slots)  # zeroed for the next ones
    again = [[] for _ in jobs]
    for i, (ids, n, sp) in enumerate(jobs):
        sched.submit(Sequence(list(ids), n, sp, lambda e, i=i: again[i].append(e)))
    _drive(sched, lambda: not sched.running and not sched.waiting)
    assert [[e[1] for e in g if e[0] == "token"] for g in again] == [solo(model, *j) for j in jobs]


@pytest.mark.parametrize("speculate", ["ngram", "mtp"])
def test_speculating_alone_keeps_every_stream(speculate):
    """speculate: a sequence decoding alone takes verify steps (drafted by prompt lookup or the MTP layer), two
    decoding together the batched step; either way every sequence's tokens are Model.sample_tokens's. The metrics
    count the drafts."""
    from dsv4.serve.metrics import Metrics

    model = dsv4.load("tiny", device="cpu", dtype=torch.float32, mtp=speculate == "mtp")
    sp = [dsv4.SamplingParams(temperature=1.0, seed=s) for s in (1, 2)]
    rep = [5, 9, 3, 7] * 4
    want = [solo(model, rep, 20, sp[0]), solo(model, [4, 4, 8], 12, sp[1])]
    metrics = Metrics("tiny")
    verified = []
    sched = Scheduler(model, max_num_seqs=2, max_model_len=64, prefill_chunk=8, metrics=metrics,
                      speculate=speculate, draft_tokens=3)
    if speculate == "ngram":  # random weights draw no n-gram's continuation: the drafter proposes the solo stream
        sched.ngram = ScriptedDrafter(len(rep), want[0])
    original = model.verify_draft if speculate == "mtp" else model.verify

    def counted(*args, **kwargs):
        verified.append(len(args[2]))
        return original(*args, **kwargs)

    setattr(model, "verify_draft" if speculate == "mtp" else "verify", counted)
    try:
        assert served(sched, [(rep, 20, sp[0]), ([4, 4, 8], 12, sp[1])]) == want
        assert verified and metrics.draft_tokens._value.get() == sum(verified)  # the drafts each verify step took
        sched = Scheduler(model, max_num_seqs=2, max_model_len=64, prefill_chunk=8, speculate=speculate,
                          draft_tokens=3)
        assert served(sched, [(rep, 20, sp[0])]) == want[:1]
    finally:
        delattr(model, "verify_draft" if speculate == "mtp" else "verify")
    assert b"dsv4_spec_decode_num_draft_tokens" in metrics.render()
    with pytest.raises(ValueError, match="speculate 'bogus'"):
        Scheduler(model, speculate="bogus")
    if speculate == "mtp":
        with pytest.raises(ValueError, match="without its MTP layer"):
            Scheduler(dsv4.load("tiny", device="cpu", dtype=torch.float32), max_num_seqs=1, speculate="mtp")


class Partial(ScriptedDrafter):
    """Proposes the first two tokens of the script's continuation at most, and nothing every fifth call."""

    calls = 0

    def propose(self, context, k):
        self.calls += 1
        return [] if self.calls % 5 == 0 else super().propose(context, min(k, 2))


def test_verify_graphs_pad_the_drafts_and_keep_the_stream(monkeypatch):
    """CONFIG verify_graphs (with graphs): short proposals padded to draft_tokens, so every verify step but a
    budget's last ones asks for the slot's one graph (graph=True; on CPU Model.verify runs it eagerly, the same
    steps), nothing proposed takes the batched step, and the stream stays Model.sample_tokens's."""
    from dsv4.serve import scheduler as sched_module

    monkeypatch.setitem(sched_module.CONFIG, "verify_graphs", True)
    model = dsv4.load("tiny", device="cpu", dtype=torch.float32)
    sp = dsv4.SamplingParams(temperature=1.0, seed=1)
    prompt = [5, 9, 3, 7] * 4
    want = solo(model, prompt, 20, sp)
    calls = []
    original, batched = model.verify, model.step_batch

    def counted(state, token, drafts, sampling, stops, graph=False):
        calls.append((len(drafts), graph))
        return original(state, token, drafts, sampling, stops, graph=graph)

    model.verify = counted
    model.step_batch = lambda *args, graph=False: batched(*args)  # on CPU the batched step runs eagerly
    sched = Scheduler(model, max_num_seqs=2, max_model_len=64, prefill_chunk=8, speculate="ngram", draft_tokens=3,
                      pipelined=False)
    sched.graphs, sched.ngram = True, Partial(len(prompt), want)
    assert served(sched, [(prompt, 20, sp)]) == [want]
    full = [c for c in calls if c[0] == 3]
    assert full and all(graph for _, graph in full)
    assert 0 not in [n for n, _ in calls] and len(calls) + sched.ngram.calls // 5 <= sched.ngram.calls
    assert all(not graph for n, graph in calls if n < 3) and len(calls) - len(full) <= 3  # a budget's last steps


def test_nothing_drafted_takes_the_batched_step(monkeypatch):
    """Where the n-gram drafter proposes nothing, the sequence takes the batched step (a verify step of no drafts is
    the plain step, slower than the batched step's graph), not a verify step; the stream is unchanged."""
    model = dsv4.load("tiny", device="cpu", dtype=torch.float32)
    sp = dsv4.SamplingParams(temperature=1.0, seed=2)
    prompt = [4, 4, 8, 11, 23]
    want = solo(model, prompt, 16, sp)
    calls = []
    original = model.verify

    def counted(state, token, drafts, *args, **kwargs):
        calls.append(len(drafts))
        return original(state, token, drafts, *args, **kwargs)

    model.verify = counted
    sched = Scheduler(model, max_num_seqs=2, max_model_len=64, prefill_chunk=8, speculate="ngram", draft_tokens=3)
    assert served(sched, [(prompt, 16, sp)]) == [want]
    assert 0 not in calls and len(calls) < 16


def test_states_that_cannot_fit_are_refused_before_any_is_allocated(model):
    """The slots and the prefix cache are whole decode states allocated at start: where they exceed what the host can
    give (CPU), the scheduler refuses before allocating one, naming the three flags, the state's size and both
    figures; a number of slots that fits is served as ever."""
    from dsv4.checkpoint.memory import available_bytes
    from dsv4.state import state_bytes

    each = state_bytes(model.cfg, 256, model.dtype)
    free, what = available_bytes(model.device)
    slots = free // each + 1  # one state more than the host can hold
    with pytest.raises(ValueError) as err:
        Scheduler(model, max_num_seqs=slots, max_model_len=256, prefix_cache=3)
    message = str(err.value)
    assert message.startswith(f"the server's states do not fit: {slots} slots (--max-num-seqs) + 3 prefix states "
                              "(--prefix-cache), each a decode state of 256 tokens (--max-model-len)"), message
    assert f"{each / 2**30:,.2f} GiB a rank" in message and what in message and "lower one of them" in message
    assert Scheduler(model, max_num_seqs=2, max_model_len=256).slots[1].capacity == 256
