"""Prefix caching (dsv4.prefix), on the tiny preset (CPU): a prompt starting from a cached prefix's state is, byte for
byte, the prompt prefilled without the cache.

Checked: a cached prefill's state digest equals the plain prefill's at the same chunk (tiny's bytes do depend on the
chunking: a prefill at chunk 7 differs from one at 8, so the chunk boundaries are what the test holds the cache to);
every entry is the plain prefill of its key; the hits (a conversation's next turn, a shared system prompt through the
snapshot taken where a prompt left a cached one, a prompt ending at a boundary); the least recently used entry gives
way; a hash collision never restores a wrong state; a failed snapshot leaves no entry; bad use is named. In the
server's scheduler: tokens with the cache equal tokens without it (one and two ranks, the MTP layer's drafted prefill
too), the hits counted in /metrics and in usage.prompt_tokens_details.cached_tokens.
"""

from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4.prefix import PrefixCache
from test_serve_scheduler import _drive, counted_prefills, served

C, CAP = 8, 256


@pytest.fixture(scope="module")
def model():
    return dsv4.load("tiny", device="cpu", dtype=torch.float32)


def ids(n, s):
    return [(s * 31 + 7 * j) % 500 + 2 for j in range(n)]


def plain(model, prompt, chunk=C):
    state = model.new_state(CAP)
    if len(prompt) > 1:
        model.prefill(state, prompt[:-1], chunk_size=chunk)
    return state


def steps(model, state, token, n=6):
    sampling = dsv4.SamplingParams(temperature=1.0, seed=3)
    out = []
    for _ in range(n):
        token = model.step(state, token, sampling)
        out.append(token)
    return out


def test_chunking_changes_tinys_bytes(model):
    """The premise of every digest check here: a prefill's bytes follow its chunk boundaries."""
    prompt = ids(61, 1)
    assert plain(model, prompt, 8).digest() != plain(model, prompt, 7).digest()


def test_a_cached_prefill_is_the_plain_prefill(model):
    cache = PrefixCache(model, 3, CAP, C)
    system = ids(40, 1)
    turn1 = system + ids(13, 2)
    prompts = [
        (turn1, 0),                          # cold: its end (48) is kept
        (turn1 + ids(20, 3), 48),            # the next turn: from turn 1's 48 tokens; its end (72) kept
        (system + ids(30, 4), 0),            # shares 40 tokens with the cache: a snapshot at 40 taken
        (system + ids(5, 5), 40),            # the system prompt, from that snapshot
        (system + [7], 40),                  # a prompt whose whole prefill (40 tokens) is cached
        (ids(9, 6), 0),                      # another prompt: its one chunk kept, the least recent entry gone
    ]
    for prompt, hit in prompts:
        state = model.new_state(CAP)
        assert cache.prefill(state, prompt) == hit, len(prompt)
        want = plain(model, prompt)
        assert state.digest() == want.digest(), len(prompt)
        assert steps(model, state, prompt[-1]) == steps(model, want, prompt[-1])
    assert cache.hits == 48 + 40 + 40 and cache.queries == sum(len(p) - 1 for p, _ in prompts)
    assert sorted(len(e.ids) for e in cache.entries.values()) == [8, 40, 64]  # 72 (the least recent) gave way
    for entry in cache.entries.values():  # every entry is the plain prefill of its key
        assert entry.state.digest() == plain(model, entry.ids + [0]).digest()
    assert set(cache.prefixes) == {h for e in cache.entries.values() for h in e.chain}


def test_least_recently_used_gives_way(model):
    cache = PrefixCache(model, 2, CAP, C)
    a, b, c = ids(17, 1), ids(17, 2), ids(17, 3)
    for prompt in (a, b):
        cache.prefill(model.new_state(CAP), prompt)
    assert cache.prefill(model.new_state(CAP), a) == 16  # a is now the most recent
    cache.prefill(model.new_state(CAP), c)  # b gives way
    assert cache.prefill(model.new_state(CAP), b) == 0
    assert cache.prefill(model.new_state(CAP), c) == 16
    assert cache.size == 2 and not cache.free


def test_a_hash_collision_never_restores_another_prompt(model, monkeypatch):
    cache = PrefixCache(model, 2, CAP, C)
    monkeypatch.setattr(cache, "_chain", lambda prompt, blocks: [1] * blocks)  # every prefix collides
    cache.prefill(model.new_state(CAP), ids(17, 1))
    state = model.new_state(CAP)
    other = ids(17, 2)
    assert cache.prefill(state, other) == 0
    assert state.digest() == plain(model, other).digest()


def test_drafted_entries_are_keyed_by_the_next_token_too(model):
    """With the MTP layer a state at P read the token at P: a prompt that differs there does not hit."""
    cache = PrefixCache(model, 2, CAP, C, drafted=True)
    prompt = ids(20, 1)
    state = plain(model, prompt[:17])
    cache.offer(prompt, 16, state)
    assert cache.match(prompt).tokens == 16
    assert cache.match(prompt[:16] + [prompt[16] + 1] + prompt[17:]).tokens == 0
    with pytest.raises(ValueError, match="drafted cache"):
        cache.prefill(model.new_state(CAP), prompt)


def test_a_failed_snapshot_leaves_no_entry(model):
    cache = PrefixCache(model, 1, CAP, C)
    prompt = ids(17, 1)
    state = plain(model, prompt)
    state.quarantine = "a refused step"  # restore refuses a quarantined source
    with pytest.raises(RuntimeError):
        cache.offer(prompt, 16, state)
    assert not cache.entries and len(cache.free) == 1 and not cache.prefixes
    assert cache.match(prompt).tokens == 0


def test_bad_use_is_named(model):
    for kwargs, words in (({"entries": 0}, "entries 0"), ({"chunk": CAP}, "no prompt"), ({"capacity": -1}, "capacity")):
        args = {"entries": 1, "capacity": CAP, "chunk": C, **kwargs}
        with pytest.raises(ValueError, match=words):
            PrefixCache(model, **args)
    cache = PrefixCache(model, 1, CAP, C)
    prompt = ids(17, 1)
    with pytest.raises(ValueError, match="fresh one"):
        cache.prefill(plain(model, prompt), prompt)
    with pytest.raises(ValueError, match="states of 256"):
        cache.prefill(model.new_state(128), prompt)
    with pytest.raises(ValueError, match="multiple of the chunk 8"):
        cache.offer(prompt, 12, plain(model, prompt[:13]))
    with pytest.raises(ValueError, match="at 16 tokens offered as the prefill of 8"):
        cache.offer(prompt, 8, plain(model, prompt))


def drive(sched, batch):
    """The scheduler's rounds in this thread over `batch` ((ids, max_tokens, sampling) each): each one's tokens."""
    from dsv4.serve.scheduler import Sequence

    out, done = [[] for _ in batch], []

    def emitter(i):
        return lambda event: out[i].append(event[1]) if event[0] == "token" else done.append(event)

    for i, (prompt, n, sampling) in enumerate(batch):
        sched.submit(Sequence(list(prompt), n, sampling, emitter(i)))
    _drive(sched, lambda: len(done) == len(batch) and not sched.running)
    sched._drain()
    assert all(e[0] == "done" for e in done), done
    return out


def jobs():
    system = ids(40, 1)
    sp = [dsv4.SamplingParams(temperature=1.0, seed=s) for s in range(4)]
    first = [(system + ids(13, 2), 6, sp[0]), (ids(21, 3), 5, sp[1])]
    second = [(system + ids(13, 2) + ids(11, 4), 6, sp[2]), (system + ids(6, 5), 7, sp[3]),
              (system + ids(30, 6), 4, sp[1])]
    return first, second


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_server_with_the_cache_serves_the_same_tokens(model, ranks):
    """Rounds of requests through the scheduler with and without a prefix cache: the same tokens; the second
    round's prompts start from the first round's snapshots (its hits counted), and every entry is the plain prefill
    of its key."""
    from dsv4.serve.metrics import Metrics
    from dsv4.serve.scheduler import Scheduler

    m = model if ranks == 1 else dsv4.load("tiny", device="cpu", dtype=torch.float32, ranks=2)
    try:
        first, second = jobs()
        want = [served(Scheduler(m, max_num_seqs=3, max_model_len=CAP, prefill_chunk=C), batch)
                for batch in (first, second)]
        metrics = Metrics("tiny")
        sched = Scheduler(m, max_num_seqs=3, max_model_len=CAP, prefill_chunk=C, metrics=metrics, prefix_cache=4)
        assert [drive(sched, batch) for batch in (first, second)] == want
        # turn 2 from turn 1's 48 tokens; the others from the 40-token system prompt's snapshot (taken when the first
        # of them left turn 1's entry) at most
        # (the metrics also count the copies from a sequence prefilling the shared system prompt at once)
        assert sched.prefix.hits >= 48 and metrics.prefix_hits._value.get() >= sched.prefix.hits + 40
        assert metrics.prefix_queries._value.get() == sum(len(p) - 1 for p, _, _ in first + second)
        if ranks == 1:
            for entry in sched.prefix.entries.values():
                assert entry.state.digest() == plain(model, entry.ids + [0]).digest()
    finally:
        if ranks == 2:
            m.close()


def test_speculating_with_the_mtp_layer_keeps_the_tokens():
    from dsv4.serve.scheduler import Scheduler

    model = dsv4.load("tiny", device="cpu", dtype=torch.float32, mtp=True)
    first, second = jobs()
    want = [served(Scheduler(model, max_num_seqs=1, max_model_len=CAP, prefill_chunk=C), [j]) for j in first + second]
    sched = Scheduler(model, max_num_seqs=1, max_model_len=CAP, prefill_chunk=C, speculate="mtp", draft_tokens=2,
                      prefix_cache=3)
    assert [drive(sched, [j]) for j in first + second] == want
    assert sched.prefix.drafted and sched.prefix.hits >= 48


def test_scheduler_refuses_a_bad_cache_size(model):
    from dsv4.serve.scheduler import Scheduler

    with pytest.raises(ValueError, match="prefix_cache -1"):
        Scheduler(model, max_num_seqs=1, max_model_len=CAP, prefix_cache=-1)


def test_usage_reports_the_cached_tokens(model):
    """Through the OpenAI client: usage.prompt_tokens_details.cached_tokens, and /metrics' counters."""
    import httpx
    import serving
    from serving import root
    from dsv4.serve import Server

    with Server(model, "127.0.0.1", 0, model_name="tiny", max_model_len=CAP, max_num_seqs=2, prefill_chunk=C,
                prefix_cache=2) as srv:
        client = serving.client(srv)
        prompt = ids(30, 1)
        cold = client.completions.create(model="tiny", prompt=prompt, max_tokens=4, seed=1)
        warm = client.completions.create(model="tiny", prompt=prompt + ids(5, 2), max_tokens=4, seed=1)
        assert cold.usage.prompt_tokens_details.cached_tokens == 0
        assert warm.usage.prompt_tokens_details.cached_tokens == 24
        again = client.completions.create(model="tiny", prompt=prompt, max_tokens=4, seed=1)
        assert again.choices[0].text == cold.choices[0].text and again.usage.prompt_tokens_details.cached_tokens == 24
        text = httpx.get(root(srv) + "/metrics").text
        line = next(x for x in text.splitlines() if x.startswith("dsv4_prefix_cache_hits_total{"))
        assert float(line.split()[-1]) == 48


def test_choices_of_one_prompt_prefill_once(model, monkeypatch):
    """With the cache on, sequences of one prompt (a request's n choices) prefill it once: the others copy the state
    when its prefill ends, at any length (no chunk boundary needed: the same prompt, the same chunks). Their tokens
    are those each prefilled alone; a leader cancelled mid-prefill leaves its followers to prefill on their own."""
    from dsv4.serve.scheduler import Scheduler

    prompt = ids(45, 7)  # a prefill of 44 tokens: 5 chunks of 8, then 4
    sp = [dsv4.SamplingParams(temperature=1.0, seed=s) for s in range(3)]
    batch = [(prompt, 5, s) for s in sp]
    want = drive(Scheduler(model, max_num_seqs=3, max_model_len=CAP, prefill_chunk=C), batch)
    chunks = []
    real = model.prefill_batch

    def counted(states, parts):
        chunks.append(len(states))
        return real(states, parts)

    monkeypatch.setattr(model, "prefill_batch", counted)
    from dsv4.serve.metrics import Metrics

    metrics = Metrics("tiny")
    sched = Scheduler(model, max_num_seqs=3, max_model_len=CAP, prefill_chunk=C, prefix_cache=1, metrics=metrics)
    assert drive(sched, batch) == want
    assert chunks == [1] * 6  # one sequence's chunks, not three
    assert metrics.prefix_hits._value.get() == 2 * 44 and metrics.prefix_queries._value.get() == 3 * 44

    # the leader cancelled after its second chunk: the followers go on by themselves (one leads, one follows)
    from dsv4.serve.scheduler import Sequence

    chunks.clear()
    sched = Scheduler(model, max_num_seqs=3, max_model_len=CAP, prefill_chunk=C, prefix_cache=1)
    out, done = [[] for _ in batch], []
    seqs = [Sequence(list(p), n, s, (lambda i: lambda e: out[i].append(e[1]) if e[0] == "token" else done.append(e))(i))
            for i, (p, n, s) in enumerate(batch)]
    for seq in seqs:
        sched.submit(seq)
    _drive(sched, lambda: len(chunks) == 2)
    assert seqs[1].leader is seqs[0] and seqs[2].leader is seqs[0]
    seqs[0].cancel()
    _drive(sched, lambda: len(done) == 2 and len(sched.running) == 0)
    sched._drain()
    assert out[1:] == want[1:]
    assert chunks == [1] * 8  # two of the leader's, then six of the new leader's


def test_sample_tokens_through_the_cache(model):
    """generation.sample_tokens(prefix=cache): the tokens of a plain prefill at the cache's capacity and chunk."""
    from dsv4.generation import sample_tokens

    cache = PrefixCache(model, 2, CAP, C)
    sp = dsv4.SamplingParams(temperature=1.0, seed=5)
    first = ids(30, 1)
    for prompt in (first, first + ids(12, 2)):
        got = list(sample_tokens(model, prompt, 6, sp, prefix=cache))
        assert got == list(sample_tokens(model, prompt, 6, sp, capacity=CAP, chunk_size=C))
    assert cache.hits == 24
    with pytest.raises(ValueError, match="capacity 128 and chunk_size None with a prefix cache of states of 256"):
        list(sample_tokens(model, first, 6, sp, capacity=128, prefix=cache))


def test_a_burst_sharing_a_system_prompt_prefills_it_once(model, monkeypatch):
    """Requests arriving together with one system prompt: one prefills it, the others copy its state at their shared
    chunk boundary and go on from there, so the 40 shared tokens are prefilled once, not three times; the tokens are
    those without the cache; the shared state is kept for later requests."""
    from dsv4.serve.metrics import Metrics
    from dsv4.serve.scheduler import Scheduler

    system = ids(40, 1)
    sp = [dsv4.SamplingParams(temperature=1.0, seed=s) for s in range(3)]
    batch = [(system + ids(n, 10 + n), 5, s) for n, s in zip((13, 22, 7), sp)]
    want = drive(Scheduler(model, max_num_seqs=3, max_model_len=CAP, prefill_chunk=C), batch)
    tokens = []
    real = model.prefill_batch

    def counted(states, parts):
        tokens.append(sum(len(p) for p in parts))
        return real(states, parts)

    monkeypatch.setattr(model, "prefill_batch", counted)
    metrics = Metrics("tiny")
    sched = Scheduler(model, max_num_seqs=3, max_model_len=CAP, prefill_chunk=C, prefix_cache=4, metrics=metrics)
    assert drive(sched, batch) == want
    assert sum(tokens) == 40 + sum(len(p) - 1 - 40 for p, _, _ in batch)
    assert metrics.prefix_hits._value.get() == 80
    assert 40 in [len(e.ids) for e in sched.prefix.entries.values()]


def test_a_cache_that_does_not_fit_is_named(model, monkeypatch):
    real = model.new_state
    made = []

    def new_state(capacity):
        if len(made) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 MiB")
        made.append(capacity)
        return real(capacity)

    monkeypatch.setattr(model, "new_state", new_state)
    with pytest.raises(ValueError, match="5 states of 256 tokens do not fit in memory .2 did."):
        PrefixCache(model, 5, CAP, C)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_arrivals_and_cancels_keep_every_stream(model, seed):
    """Requests arriving over the rounds, sharing system prompts at random lengths (some the same prompt), some
    cancelled while they prefill or follow another: every request's tokens are its stream alone (the ones cancelled, a
    prefix of it), through the cache, the hand-overs and the orphaned followers."""
    import random

    from dsv4.generation import sample_tokens
    from dsv4.serve.scheduler import Scheduler, Sequence

    rng = random.Random(seed)
    systems = [ids(rng.randint(9, 40), 50 + i) for i in range(2)]
    pool = []
    for i in range(12):
        base = rng.choice(systems)
        prompt = base[:rng.randint(len(base) // 2, len(base))] + ids(rng.randint(1, 20), 100 + i)
        pool.append(prompt if rng.random() > 0.25 or not pool else rng.choice(pool))
    sp = [dsv4.SamplingParams(temperature=1.0, seed=rng.randrange(100)) for _ in pool]
    from dsv4.serve.metrics import Metrics

    metrics = Metrics("tiny")
    sched = Scheduler(model, max_num_seqs=3, max_model_len=CAP, prefill_chunk=C, max_waiting=16, prefix_cache=3,
                      metrics=metrics)
    followed = []
    real = sched._hand_over
    sched._hand_over = lambda seq: (followed.append(len(seq.followers)), real(seq))
    out = [[] for _ in pool]
    seqs, cancelled, ended = [], set(), set()
    for i, prompt in enumerate(pool):
        seqs.append(Sequence(list(prompt), 5, sp[i], (lambda i: lambda e: out[i].append(e[1]) if e[0] == "token"
                                                       else ended.add(i))(i)))
    nxt = 0
    for _ in range(600):
        if nxt < len(seqs) and rng.random() < 0.5:
            sched.submit(seqs[nxt])
            nxt += 1
        live = [j for j in range(nxt) if j not in ended and j not in cancelled]
        if live and rng.random() < 0.08:
            j = rng.choice(live)
            seqs[j].cancel()
            cancelled.add(j)
        if nxt == len(seqs) and not sched.running and not sched.waiting:
            break
        if sched.running or sched.waiting:
            sched._admit()
            sched._round()
    else:
        raise AssertionError("the scheduler did not finish")
    sched._drain()
    assert metrics.prefix_hits._value.get() > 0  # seeds 0 and 1 also hand states over (8 and 2 followers)
    for i, prompt in enumerate(pool):
        want = list(sample_tokens(model, prompt, 5, sp[i], capacity=CAP, chunk_size=C))
        if i in cancelled:
            assert out[i] == want[:len(out[i])], i
        else:
            assert out[i] == want, i
    assert sum(1 for i in range(len(pool)) if i not in cancelled) >= 6


def test_a_leader_refused_mid_prefill_leaves_its_followers_their_streams(model, monkeypatch):
    """A request's three choices: the one prefilling is refused in its second chunk (its choice fails with the
    engine's error, nothing committed); the two following it are looked up again, one leads, and both get their
    streams alone."""
    from dsv4.serve.scheduler import Scheduler, Sequence

    prompt = ids(45, 7)
    sp = [dsv4.SamplingParams(temperature=1.0, seed=s) for s in range(3)]
    want = drive(Scheduler(model, max_num_seqs=3, max_model_len=CAP, prefill_chunk=C), [(prompt, 5, s) for s in sp])
    calls = counted_prefills(model, monkeypatch, refuse=lambda sizes: len(sizes) == 2)  # the leader's second chunk
    sched = Scheduler(model, max_num_seqs=3, max_model_len=CAP, prefill_chunk=C, prefix_cache=1)
    out, events = [[] for _ in sp], [[] for _ in sp]
    for i, s in enumerate(sp):
        sched.submit(Sequence(list(prompt), 5, s, (lambda i: lambda e: (out[i].append(e[1]) if e[0] == "token"
                                                                        else events[i].append(e)))(i)))
    _drive(sched, lambda: all(events) and not sched.running)
    sched._drain()
    assert [e[0][0] for e in events] == ["error", "done", "done"]
    assert out[1:] == want[1:] and out[0] == []
    assert calls == [1] * 8  # the leader's two chunks (the second refused), then the new leader's six


def test_state_bytes_counts_a_states_buffers(model):
    """dsv4.state.state_bytes (the serve banner's figure) is what a state of that capacity allocates."""
    from dsv4.state import state_bytes

    state = model.new_state(CAP)
    assert state_bytes(model.cfg, CAP, model.dtype) == sum(t.numel() * t.element_size() for _, t in state.committed())
    assert state_bytes(model.cfg, 2 * CAP, model.dtype) > state_bytes(model.cfg, CAP, model.dtype)
