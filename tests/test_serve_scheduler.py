"""The serving scheduler without HTTP, on the tiny preset (CPU).

Checked: sequences run together give, token for token, what each gives alone (`Model.sample_tokens`,
sampled with its seed), slots reused after others included; a long prompt is prefilled in chunks
while a running sequence keeps decoding; a cancelled sequence frees its slot; a full waiting
queue refuses.
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

    for i, (ids, n, sampling) in enumerate(seqs):
        sched.submit(Sequence(list(ids), n, sampling, emitter(i)))
    assert done.wait(timeout), "the scheduler did not finish"
    return out, log


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
    step_batch = model.step_batch

    def counted(states, *args, **kwargs):  # the real batched step, its row counts recorded
        sizes.append(len(states))
        return step_batch(states, *args, **kwargs)

    monkeypatch.setattr(model, "step_batch", counted)
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
    and on two ranks (gloo) sequences together equal each alone, as on one."""
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
        sched = Scheduler(two, max_num_seqs=2, max_model_len=64)
        sched.start()
        try:
            got, _ = run(sched, jobs)
        finally:
            sched.stop()
        assert got == expected
    finally:
        two.close()
