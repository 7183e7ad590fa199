"""Pooled decode (dsv4.state.StatePool; issue 12): the states of a batch stacked along a slot axis, and the
one-token step that serves every row with one launch per kernel (model.step.PoolStep, attention_pooled,
the POOLED kernel variants).

The contract is batched == solo's: a pooled row's token, logits and every committed byte equal those of
the same sequence stepped alone, both as a plain DecodeState (today's per-sequence path) and as a pooled
state alone (the pooled path with B = 1), for rows at different positions crossing compress closes and
window wraps, joining and leaving, and a refused step commits nothing. The pooled kernels are not yet
GPU-checked, so "auto" keeps them off; these tests turn the fused attention / compressor / indexer
dispatch on (`fused_attention`: Triton's interpreter on CPU) for the steps, while prefill (identical for
both) runs the reference. On CUDA the same tests run the compiled kernels.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import sys
import types
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import dsv4
import dsv4.model.attention as model_attention
import dsv4.model.compressor as model_compressor
import dsv4.model.forward as model_forward
import dsv4.model.step as model_step
from dsv4 import RefusalError, SamplingParams
from dsv4.engine import Batch
from dsv4.kernels import attention as attention_kernel
from dsv4.kernels import commit_step, compressor as compressor_kernel, normrope as normrope_kernel
from dsv4.state import Pools, StatePool, pool_of
from dsv4.syncguard import NoHostSync

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CAPACITY = 40
# Decode starts at positions 14 (window wrapped; rate 4 and 16 windows close at 15), 2 (rate 4 closes at 3)
# and 29 (both close at 31): tiny has sliding_window 8, compress rates 4 (CSA) and 16 (HCA).
PROMPTS = [list(range(20, 35)), [7, 8, 9], [(11 * i) % 500 + 1 for i in range(30)]]
SAMPLINGS = [SamplingParams(temperature=1.0, seed=3), SamplingParams(temperature=0.0),
             SamplingParams(temperature=0.8, top_k=5, seed=9)]
STEPS = 3


@pytest.fixture(scope="module")
def model():
    return dsv4.load("tiny", device=DEVICE)


@contextlib.contextmanager
def fused_attention():
    """The fused attention, compressor and indexer kernels (plain and pooled) for every step within;
    counts the pooled layers run (`.pooled`)."""
    on = types.SimpleNamespace(use_triton=lambda *a, **k: True)
    saved = [(m, m.kernels) for m in (model_attention, model_compressor, model_forward)]
    real = model_forward.attention_pooled
    seen = types.SimpleNamespace(pooled=0)

    def spy(*args, **kwargs):
        seen.pooled += 1
        return real(*args, **kwargs)

    for m, _ in saved:
        m.kernels = on
    model_forward.attention_pooled = spy
    try:
        yield seen
    finally:
        for m, k in saved:
            m.kernels = k
        model_forward.attention_pooled = real


def prefilled(model, state, i):
    model.prefill(state, PROMPTS[i][:-1])
    return state


@pytest.fixture(scope="module")
def solos(model):
    """Each sequence stepped alone as a plain DecodeState: [(token, logits, digest)] per step."""
    out = []
    for i in range(len(PROMPTS)):
        state, token, steps = prefilled(model, model.new_state(CAPACITY), i), PROMPTS[i][-1], []
        with fused_attention() as seen:
            for _ in range(STEPS):
                token = model.step(state, token, SAMPLINGS[i])
                steps.append((token, state.logits.clone(), state.digest()))
        assert seen.pooled == 0
        out.append(steps)
    return out


def check_row(state, token, solo, where: str):
    assert token == solo[0], f"{where}: token differs from solo"
    assert torch.equal(state.logits, solo[1]), f"{where}: logits differ from solo"
    assert state.digest() == solo[2], f"{where}: committed bytes differ from solo"


@pytest.mark.parametrize("i,slot", [(0, 2), (2, 0)])
def test_pooled_alone_equals_plain_alone(model, solos, i, slot):
    pool = StatePool(model.cfg, 3, CAPACITY, model.device, model.dtype)
    state, token = prefilled(model, pool.state(slot), i), PROMPTS[i][-1]
    with fused_attention() as seen:
        for step in range(STEPS):
            token = model.step(state, token, SAMPLINGS[i])
            check_row(state, token, solos[i][step], f"sequence {i}, step {step}")
    assert seen.pooled == STEPS * model.cfg.num_hidden_layers


@pytest.mark.parametrize("rows,slots", [([0, 2], [3, 1]), ([0, 1, 2], [2, 0, 3])])
def test_pooled_batch_equals_solo(model, solos, rows, slots):
    pool = StatePool(model.cfg, 4, CAPACITY, model.device, model.dtype)
    states = [prefilled(model, pool.state(s), i) for s, i in zip(slots, rows)]
    tokens = [PROMPTS[i][-1] for i in rows]
    with fused_attention() as seen:
        for step in range(STEPS):
            tokens = list(model.step_batch(states, tokens, [SAMPLINGS[i] for i in rows]))
            for b, i in enumerate(rows):
                check_row(states[b], tokens[b], solos[i][step], f"sequence {i} (slot {slots[b]}), step {step}")
    assert seen.pooled == STEPS * model.cfg.num_hidden_layers


def test_rows_join_and_leave(model, solos):
    """Inactive rows commit nothing; each row's k-th active step is its solo step k."""
    pool = StatePool(model.cfg, 3, CAPACITY, model.device, model.dtype)
    states = [prefilled(model, pool.state(b), b) for b in range(3)]
    tokens = [PROMPTS[i][-1] for i in range(3)]
    done = [0, 0, 0]
    with fused_attention() as seen:
        for mask in ([True, False, True], [False, True, True]):
            before = [s.digest() for s in states]
            out = model.step_batch(states, tokens, SAMPLINGS, active=mask)
            for b, on in enumerate(mask):
                if on:
                    check_row(states[b], out[b], solos[b][done[b]], f"sequence {b}, step {done[b]}")
                    tokens[b], done[b] = out[b], done[b] + 1
                else:
                    assert out[b] == -1 and states[b].digest() == before[b], f"inactive row {b} changed"
    assert seen.pooled == 2 * model.cfg.num_hidden_layers


def test_refused_pooled_step_commits_nothing(model):
    pool = StatePool(model.cfg, 3, CAPACITY, model.device, model.dtype)
    states = [pool.state(b) for b in range(3)]
    before = [s.digest() for s in states]
    counts = pool.store.counts.clone()
    model.arm_refusal(2, 0, 7, "attention")
    try:
        with fused_attention(), pytest.raises(RefusalError, match="layer 2 site attention"):
            model.step_batch(states, [PROMPTS[i][-1] for i in range(3)], SAMPLINGS)
    finally:
        model.reset_refusals()
    assert [s.digest() for s in states] == before
    assert pool.store.counts[:, 1].tolist() == counts[:, 1].tolist()  # no commit counted
    assert pool.store.counts[:, 0].tolist() == (counts[:, 0] + 1).tolist()  # the forward ran
    assert all(s.quarantine is not None for s in states)


def test_pooled_step_makes_no_host_sync(model):
    pool = StatePool(model.cfg, 4, CAPACITY, model.device, model.dtype)
    states = [pool.state(s) for s in (1, 3, 0)]
    batch = Batch(states, model.device)
    batch.input.copy_(torch.tensor([PROMPTS[i][-1] for i in range(3)]))
    batch.active.copy_(torch.tensor([True, False, True]))
    batch.rows.load(SAMPLINGS)
    pool.index(states)  # the slot ids are gathered once, by a device op, and kept
    with fused_attention() as seen, torch.inference_mode(), NoHostSync():
        model.step_batch_device(batch)
    assert seen.pooled == model.cfg.num_hidden_layers


# ---- launches -------------------------------------------------------------------------------------------
_TORCH = str(Path(torch.__file__).resolve().parent)
_PER_SEQUENCE = ("model/step.py", "model/attention.py", "model/compressor.py", "model/commit.py",
                 "model/forward.py", "dsv4/state.py", "kernels/attention.py", "kernels/compressor.py",
                 "kernels/commit_step.py", "kernels/commit.py")


class _Launches(TorchDispatchMode):
    """Counts the torch ops and Triton launches the per-sequence part of a step issues (the files above:
    the row-wise parts, whose CPU reference runs row by row, are not counted)."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _issuer().endswith(_PER_SEQUENCE):
            self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _issuer() -> str:
    """The file of the innermost frame outside torch and this file: the code that issued the op."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith(_TORCH) or name == __file__):
            return Path(name).as_posix()
        frame = frame.f_back
    return ""


@contextlib.contextmanager
def _launches_counted(ops: collections.Counter):
    """Triton launches counted by kernel, and not run (the count needs no numbers; the interpreter is slow)."""
    modules = (attention_kernel, compressor_kernel, commit_step, normrope_kernel)
    real = {m: m.launcher for m in modules}

    def launcher(fn, t):
        if fn.__module__ != normrope_kernel.__name__:  # row-wise, one launch: not the per-sequence part
            ops[fn.__name__] += 1
        return collections.defaultdict(lambda: lambda *args, **kwargs: None)

    for m in modules:
        m.launcher = launcher
    try:
        yield
    finally:
        for m in modules:
            m.launcher = real[m]


def _step_launches(model, states) -> int:
    return sum(_step_ops(model, states).values())


def _step_ops(model, states) -> collections.Counter:
    B = len(states)
    tokens = torch.tensor([PROMPTS[i % 3][-1] for i in range(B)], device=model.device)
    active = torch.ones(B, dtype=torch.bool, device=model.device)
    counter = _Launches()
    with fused_attention(), torch.inference_mode(), _launches_counted(collections.Counter()):
        model.transformer.transaction(states, tokens, active)  # warm: the pool's slot ids are made once
        # The eager commit uploads its address table (4 ops) only when an address changed since the last step;
        # the rows it writes are fresh tensors, so that depends on where the allocator put them (on what ran
        # before in the process: 149 against 145 ops in either order on CUDA). Always upload in the count.
        commit_step._tables.last = None
        with _launches_counted(counter.ops), counter:
            model.transformer.transaction(states, tokens, active)
    return counter.ops


def test_pooled_step_launches_do_not_grow_with_rows(model, monkeypatch):
    # On CUDA the rows' rope tables are one op; on CPU rows_cos_sin goes row by row for ATen's SIMD tails.
    monkeypatch.setattr(model_step, "rows_cos_sin", lambda rope, positions, kind: rope.cos_sin(positions, kind))
    pool = StatePool(model.cfg, 5, CAPACITY, model.device, model.dtype)
    ops = {B: _step_ops(model, [pool.state(s) for s in range(B)]) for B in (1, 4)}
    counts = {B: sum(c.values()) for B, c in ops.items()}
    plain = {B: _step_launches(model, [model.new_state(CAPACITY) for _ in range(B)]) for B in (1, 4)}
    # the ops that differ, when any
    assert counts[1] == counts[4], (counts, plain, dict(ops[1] - ops[4]), dict(ops[4] - ops[1]))
    assert plain[4] > plain[1] + 3 * model.cfg.num_hidden_layers, plain  # the counter sees per-row work


# ---- the pool itself ------------------------------------------------------------------------------------
def test_pool_states_are_views_of_one_store(model):
    pool = StatePool(model.cfg, 3, 16, model.device, model.dtype)
    a, b = pool.state(0), pool.state(2)
    assert pool_of([a, b]) is pool and pool_of([a, pool.state(0)]) is None
    assert pool_of([a, model.new_state(16)]) is None
    assert a.digest() == model.new_state(16).digest()
    model.decode(a, 5)
    assert a.layers[0].win.data_ptr() == pool.store.layers[0].win.data_ptr()
    assert int(pool.store.pos[0]) == 1 and int(pool.store.pos[2]) == 0
    b.restore(a)
    assert b.digest() == a.digest() and b.host_pos == 1
    a.discard()
    assert a.digest() == model.new_state(16).digest() and b.digest() != a.digest()
    assert pool.index([b, a]).tolist() == [2, 0] and pool.index([a, pool.state(1)]).tolist() == [0, 1]
    alone = [pool.index([pool.state(k)]) for k in range(3)]
    assert [t.tolist() for t in alone] == [[0], [1], [2]] and all(t.data_ptr() % 16 == 0 for t in alone)


def test_env_pools_hand_out_the_lowest_free_slot(model):
    pools = Pools(2, model.cfg, model.device, model.dtype)
    a, b, c = (pools.new_state(16) for _ in range(3))
    assert (a.slot, b.slot, c.slot) == (0, 1, 0) and a.pool is b.pool is not c.pool
    model.decode(a, 5)
    del a
    gc.collect()
    d = pools.new_state(16)
    assert d.slot == 0 and d.pool is b.pool and d.digest() == model.new_state(16).digest()
    assert pools.new_state(8).pool is not b.pool  # one list of pools per capacity


def test_env_switch(monkeypatch):
    monkeypatch.setenv("DSV4_POOL", "3")
    model = dsv4.load("tiny", device="cpu")
    s = model.new_state(8)
    assert s.pool is not None and s.pool.slots == 3
    monkeypatch.setenv("DSV4_POOL", "x")
    with pytest.raises(ValueError, match="DSV4_POOL"):
        dsv4.load("tiny", device="cpu")


# ---- the pooled kernels against the plain ones, row by row (fresh random inputs) --------------------------
def _rand(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)


@pytest.mark.parametrize("heads", [4, 16])
def test_pooled_attention_kernel_is_the_plain_kernel_per_row(heads):
    """Exactly (bit for bit) the plain kernel launched on each row alone with its slot's caches."""
    gen = torch.Generator().manual_seed(heads)
    B, slots, hd, half, W, NS, K = 3, 4, 32, 8, 8, 10, 6
    ids = torch.tensor([2, 0, 3], device=DEVICE)
    on = lambda *shape, p: (torch.rand(*shape, generator=gen) < p).to(DEVICE)  # noqa: E731
    q, win, kv = _rand(gen, B, heads, hd), _rand(gen, slots, W, hd), _rand(gen, B, hd)
    visible, sink = on(B, W + 1, p=0.7), _rand(gen, heads)
    cos, sin = _rand(gen, B, half), _rand(gen, B, half)
    comp, new = _rand(gen, slots, NS, hd), _rand(gen, B, 1, hd)
    sel = torch.randint(0, NS + 1, (B, K), generator=gen).to(DEVICE)
    kinds = {"sliding": {}, "csa": dict(comp=comp, new=new, sel=sel, valid=on(B, K, p=0.8)),
             "hca": dict(comp=comp, new=new, committed=on(B, NS, p=0.5), new_visible=on(B, 1, p=0.5))}
    for kind, extra in kinds.items():
        args = (q, win, kv, visible, sink, cos, sin)
        assert attention_kernel.supported(*args, **extra, ids=ids)
        got = attention_kernel.attention(*args, **extra, ids=ids)
        for b in range(B):
            s = int(ids[b])
            row = {k: v[s] if k == "comp" else (v[b] if k == "new" else v[b:b + 1]) for k, v in extra.items()}
            if kind == "hca":
                row["committed"] = extra["committed"][b]
            alone = attention_kernel.attention(q[b:b + 1], win[s], kv[b:b + 1], visible[b:b + 1], sink,
                                               cos[b:b + 1], sin[b:b + 1], **row)
            assert torch.equal(got[b:b + 1], alone), f"{kind}, row {b}"


@pytest.mark.parametrize("split", [False, True])
def test_pooled_compressor_and_index_kernels_are_the_plain_ones_per_row(model, monkeypatch, split):
    """Pool entries and index keys of each row, against the plain kernels on a Step at the row's position;
    `split`: the pool's channels split over programs (then normed and rotated by a second launch)."""
    if split:
        monkeypatch.setattr(compressor_kernel, "POOL_SPLIT_ABOVE", 0)
        monkeypatch.setattr(compressor_kernel, "POOL_CHANNELS", 16)
    gen = torch.Generator().manual_seed(1)
    cfg, rope = model.cfg, model.transformer.rope
    positions, ids, slots, rows = [14, 3, 31], torch.tensor([1, 3, 0], device=DEVICE), 4, 12
    pos = torch.tensor(positions, device=DEVICE)
    pooled = model_step.PoolStep(pos, ids, rope, cfg.sliding_window)
    B, dim, dI, H = len(positions), cfg.head_dim, cfg.index_head_dim, cfg.index_n_heads
    for m, overlap in ((4, True), (16, False)):
        width, R = (2 * dim, 2 * m) if overlap else (dim, m)
        kv, gate = _rand(gen, B, width), _rand(gen, B, width)
        ring_kv, ring_gate = _rand(gen, slots, R, width), _rand(gen, slots, R, width)
        ape, norm = _rand(gen, m, width), _rand(gen, dim)
        got = compressor_kernel.pool(kv, gate, ring_kv, ring_gate, ape, norm, pooled.windows(m, R, rows), overlap,
                                     1e-6, ids=ids)
        for b, p in enumerate(positions):
            win = model_step.Step(pos[b], 1, rope, cfg.sliding_window).windows(m, R, rows)
            s = int(ids[b])
            alone = compressor_kernel.pool(kv[b:b + 1], gate[b:b + 1], ring_kv[s], ring_gate[s], ape, norm, win,
                                           overlap, 1e-6)
            assert torch.equal(got[b:b + 1], alone), f"rate {m}, row {b}"
    q, weights = _rand(gen, B, H, dI), _rand(gen, B, H)
    icomp, inew = _rand(gen, slots, rows, dI), _rand(gen, B, 1, dI)
    win, (cos, sin) = pooled.windows(4, 8, rows), pooled.cos_sin("compress")
    got = compressor_kernel.index_keys(q, weights, cos, sin, icomp, inew, win.committed, win.visible, ids=ids)
    for b in range(B):
        step = model_step.Step(pos[b], 1, rope, cfg.sliding_window)
        w1, (c1, s1) = step.windows(4, 8, rows), step.cos_sin("compress")
        alone = compressor_kernel.index_keys(q[b:b + 1], weights[b:b + 1], c1, s1, icomp[int(ids[b])], inew[b],
                                             w1.committed, w1.visible)
        assert torch.equal(got[b:b + 1], alone), f"index keys, row {b}"
