"""Prefix caching on CUDA (GPU only; skipped on CPU): a prefill from a cached prefix is the plain prefill byte for
byte with the prefill kernels as they run by default (short chunks through the pair kernels, long ones through
moe_tc's tiles and the dequantised GEMMs), and the server's scheduler, its steps as graphs, serves the same tokens
with the cache as without it (tests/test_prefix_cache.py proves both on CPU). `dsv4 serve --prefix-cache` stays
off by default until this file has passed on a GPU.
"""

from __future__ import annotations

import os

import pytest
import torch

import dsv4
from dsv4.prefix import PrefixCache
from test_prefix_cache import drive

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PRESET = os.environ.get("DSV4_GPU_PRESET", "mini")
CAP = 1024


@pytest.fixture(scope="module")
def model():
    return dsv4.load(PRESET, device="cuda", seed=0)


def ids(model, n, s):
    g = torch.Generator().manual_seed(s)
    return torch.randint(2, model.cfg.vocab_size, (n,), generator=g).tolist()


@pytest.mark.parametrize("chunk", [64, 256])
def test_a_cached_prefill_is_the_plain_prefill(model, chunk):
    cache = PrefixCache(model, 3, CAP, chunk)
    system = ids(model, 300, 1)
    turn1 = system + ids(model, 40, 2)
    prompts = [turn1, turn1 + ids(model, 90, 3), system + ids(model, 70, 4), system + ids(model, 20, 5)]
    hits = []
    for prompt in prompts:
        state = model.new_state(CAP)
        hits.append(cache.prefill(state, prompt))
        want = model.new_state(CAP)
        model.prefill(want, prompt[:-1], chunk_size=chunk)
        assert state.digest() == want.digest(), (chunk, len(prompt))
        assert torch.equal(state.logits, want.logits)
    assert hits[1] == (len(turn1) - 1) // chunk * chunk and hits[3] == 300 // chunk * chunk


def test_the_scheduler_serves_the_same_tokens_with_graphs(model):
    from dsv4.serve.scheduler import Scheduler

    sp = [dsv4.SamplingParams(temperature=1.0, seed=s) for s in range(3)]
    system = ids(model, 300, 1)
    first = [(system + ids(model, 40, 2), 12, sp[0]), (ids(model, 90, 3), 12, sp[1])]
    second = [(system + ids(model, 40, 2) + ids(model, 30, 4), 12, sp[2]), (system + ids(model, 25, 5), 12, sp[0])]
    want = [drive(Scheduler(model, max_num_seqs=2, max_model_len=CAP, prefill_chunk=64), b) for b in (first, second)]
    sched = Scheduler(model, max_num_seqs=2, max_model_len=CAP, prefill_chunk=64, prefix_cache=3)
    assert sched.graphs
    assert [drive(sched, b) for b in (first, second)] == want
    assert sched.prefix.hits >= 320
