"""The compressor's pooling kernel and the indexer's scores + top-k (dsv4.kernels.compressor) against
their references, dsv4.model.compressor.compress and index_topk.

On CPU the kernels run through Triton's interpreter. Tolerances: fp32 entries within
rtol = atol = 1e-5 (the kernel's softmax denominator is accumulated online, its sums in another
order); bf16 entries within one bf16 rounding step (rtol 2**-7, atol 1e-5). Indexer scores in fp32
within rtol = atol = 1e-5; the selection (indices, order and validity) equal exactly, ties included:
on dyadic inputs every score is exact in both paths, so equal scores are equal bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from dsv4 import kernels
from dsv4.config import preset
from dsv4.kernels import compressor as fused
from dsv4.model.compressor import compress, compress_pair, index_topk
from dsv4.model.rope import Rope
from dsv4.model.step import Step
from dsv4.formats import QWeight
from dsv4.syncguard import NoHostSync
from batching import decode_twice

pytest.importorskip("triton")

DEVICES = (["cpu"] if kernels.interpreting() else []) + (["cuda"] if torch.cuda.is_available() else [])
CFG = preset("tiny")  # qk_rope_head_dim 16: RoPE on 8 pairs
D = 64  # hidden size of the chunk's rows x


def both(monkeypatch, fn):
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    ref = fn()
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    return ref, fn()


def windows(pos: int, T: int, m: int, R: int, rows: int, device):
    step = Step(torch.tensor(pos, device=device), T, Rope(CFG, device), CFG.sliding_window)
    return step, step.windows(m, R, rows)


def compressor_inputs(m: int, dim: int, overlap: bool, T: int, dtype, device, seed: int):
    g = torch.Generator().manual_seed(seed)
    width, R = (2 * dim, 2 * m) if overlap else (dim, m)
    rnd = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).to(device)  # noqa: E731
    w = {"wkv": QWeight(rnd(width, D, scale=0.2).to(dtype)), "wgate": QWeight(rnd(width, D, scale=0.5).to(dtype)),
         "ape": rnd(m, width), "norm": (torch.rand(dim, generator=g) + 0.5).to(device)}
    x = rnd(T, D).to(dtype)
    ring_kv, ring_gate = rnd(R, width).to(dtype), rnd(R, width, scale=2.0).to(dtype)
    return w, x, ring_kv, ring_gate


def run_compress(w, x, ring_kv, ring_gate, store, win, overlap):
    writes = []
    entries = compress(x, w, ring_kv, ring_gate, store, win, overlap, 1e-6, writes)
    return entries, writes


# (overlap, m, dim, pos, T): first windows (no previous window), closes, ring wraps, chunks touching
# several windows; dim 1024 with 2m = 16 slots pools in two slot blocks, the first one all dead at
# window 0; HCA m = 64, dim 256 pools in two blocks of 32 slots.
POOL_CASES = [(True, 4, 32, 0, 1), (True, 4, 32, 3, 1), (True, 4, 32, 9, 1), (True, 4, 32, 14, 3),
              (True, 4, 32, 2, 7), (True, 8, 1024, 0, 1), (True, 8, 1024, 21, 2), (False, 16, 32, 15, 1),
              (False, 16, 32, 40, 1), (False, 16, 32, 30, 20), (False, 64, 256, 63, 1), (False, 64, 256, 130, 1)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("overlap,m,dim,pos,T", POOL_CASES)
def test_pool(monkeypatch, device, dtype, overlap, m, dim, pos, T):
    w, x, ring_kv, ring_gate = compressor_inputs(m, dim, overlap, T, dtype, device, seed=pos * 31 + m + T)
    rows = 64 // m + 2
    store = torch.zeros(rows, dim, dtype=dtype, device=device)
    _, win = windows(pos, T, m, ring_kv.shape[0], rows, device)
    assert fused.pool_supported(x.new_empty(T, ring_kv.shape[1]), ring_kv, w["ape"], w["norm"], win.cos, overlap)
    (ref, ref_writes), (got, got_writes) = both(
        monkeypatch, lambda: run_compress(w, x, ring_kv, ring_gate, store, win, overlap))
    assert got.dtype == ref.dtype == dtype and got.shape == ref.shape == (win.cur.shape[0], dim)
    if dtype == torch.float32:
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(got.float(), ref.float(), rtol=2 ** -7, atol=1e-5)
    # The same staged writes: ring rows of the chunk, and the entries where their window closed.
    assert len(got_writes) == len(ref_writes) == 3
    for a, b in zip(got_writes, ref_writes):
        assert a.buf is b.buf and torch.equal(a.index, b.index)
        assert (a.keep is None) == (b.keep is None) and (a.keep is None or torch.equal(a.keep, b.keep))
    # The ring rows are the projections (under DSV4_KERNELS=triton the dense GEMV's, within its tolerance).
    close = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2 ** -7, atol=1e-5)
    torch.testing.assert_close(got_writes[0].rows.float(), ref_writes[0].rows.float(), **close)
    assert got_writes[2].rows is got
    assert torch.equal(store, torch.zeros_like(store))  # nothing is written before the commit


def indexer_inputs(T: int, H: int, dI: int, n_win: int, rows: int, device, seed: int, dyadic: bool = False):
    """Random inputs, or dyadic ones (small integers, scales powers of two): every score then exact."""
    g = torch.Generator().manual_seed(seed)
    if dyadic:
        draw = lambda *s, lo=-2, hi=3: torch.randint(lo, hi, s, generator=g).float()  # noqa: E731
        wq_b = torch.zeros(H * dI, 16)
        wq_b[:, :] = draw(H * dI, 16, lo=-1, hi=2)
        q_res = torch.zeros(T, 16)
        q_res[:, :3] = draw(T, 3, lo=-1, hi=2)
        weights_proj = torch.zeros(H, D)
        weights_proj[:, 0] = draw(H, lo=-2, hi=3)
        x = torch.zeros(T, D)
        x[:, 0] = 1.0
        x[0, 0] = -1.0  # query 0: every weight negated (zeros of its ReLU become -0.0 sums)
        base = draw(3, dI)  # three distinct rows, repeated: many exact ties
        icomp = base[torch.randint(0, 3, (rows,), generator=g)] * torch.randint(0, 2, (rows, 1), generator=g)
        inew = base[torch.randint(0, 3, (n_win,), generator=g)]
    else:
        wq_b = torch.randn(H * dI, 16, generator=g) * 0.3
        q_res = torch.randn(T, 16, generator=g)
        weights_proj = torch.randn(H, D, generator=g) * 0.3
        x = torch.randn(T, D, generator=g)
        icomp, inew = torch.randn(rows, dI, generator=g), torch.randn(n_win, dI, generator=g)
    w = {"wq_b": QWeight(wq_b.to(device)), "weights_proj": QWeight(weights_proj.to(device))}
    return q_res.to(device), x.to(device), w, icomp.to(device), inew.to(device)


def reference_scores(q_res, x, cos, sin, w, icomp, inew, win, H, dI):
    """The reference's scores before its sort (dsv4.model.compressor.index_topk, written out)."""
    from dsv4.model.rope import apply_rope

    T = x.shape[0]
    q = apply_rope((q_res @ w["wq_b"].data.T).view(T, H, dI), cos, sin).float()
    s = torch.relu(torch.einsum("thd,nd->thn", q, torch.cat([icomp, inew]).float())) * dI ** -0.5
    s = (s * ((x @ w["weights_proj"].data.T).float() * H ** -0.5).unsqueeze(-1)).sum(dim=1)
    return s.masked_fill(~torch.cat([win.committed.expand(T, -1), win.visible], dim=-1), float("-inf"))


def key_scores(keys):
    """The fp32 score a sort key holds (the inverse of the kernel's encoding)."""
    ordered = (~(keys >> 32)).to(torch.int32)
    return (ordered ^ ((ordered >> 31) & 0x7FFFFFFF)).view(torch.float32)


# (pos, T, m, H, dI, topk): before the first close, after closes, small prefill chunks, k above the count.
# Heads and dI are powers of 4, so that both scales are powers of two (exact on dyadic inputs).
INDEX_CASES = [(1, 1, 4, 16, 16, 8), (13, 1, 4, 64, 16, 8), (31, 1, 4, 4, 16, 6), (22, 3, 4, 16, 64, 8),
               (40, 5, 4, 64, 16, 64), (7, 2, 8, 16, 16, 4)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pos,T,m,H,dI,topk", INDEX_CASES)
@pytest.mark.parametrize("dyadic", [False, True], ids=["random", "ties"])
def test_index_topk(monkeypatch, device, pos, T, m, H, dI, topk, dyadic):
    rows = 64 // m + 2
    step, win = windows(pos, T, m, 2 * m, rows, device)
    n_win = win.cur.shape[0]
    q_res, x, w, icomp, inew = indexer_inputs(T, H, dI, n_win, rows, device, seed=pos + 7 * T + H, dyadic=dyadic)
    if dyadic:  # no rotation: RoPE's cos/sin are not dyadic
        cos = torch.ones(T, CFG.qk_rope_head_dim // 2, device=device)
        sin = torch.zeros_like(cos)
    else:
        cos, sin = step.cos_sin("compress")
    q = (q_res @ w["wq_b"].data.T).view(T, H, dI)
    assert fused.index_supported(q, icomp, inew, cos)
    (ref_sel, ref_valid), (sel, valid) = both(
        monkeypatch, lambda: index_topk(q_res, x, cos, sin, w, icomp, inew, win, topk, H, dI))
    assert sel.dtype == ref_sel.dtype == torch.int64 and valid.dtype == ref_valid.dtype == torch.bool
    assert torch.equal(sel, ref_sel) and torch.equal(valid, ref_valid)

    ref = reference_scores(q_res, x, cos, sin, w, icomp, inew, win, H, dI)
    keys = fused.index_keys(q, (x @ w["weights_proj"].data.T), cos, sin, icomp, inew, win.committed, win.visible)
    got = key_scores(keys)
    if dyadic:
        assert torch.equal(got, torch.where(ref == 0, 0.0, ref))
        # Three distinct rows and zero rows: at most 4 distinct scores per query, the rest are ties.
        finite = [r[r > float("-inf")] for r in ref]
        assert all(f.unique().numel() <= 4 for f in finite)
    else:
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_ties_go_to_the_lowest_index_in_order(monkeypatch, device):
    """All visible scores equal: the selection is the lowest visible indices, ascending, then the
    invisible ones (-inf) ascending and marked invalid."""
    T, H, dI, m, rows = 1, 16, 16, 4, 10
    step, win = windows(17, T, m, 2 * m, rows, device)  # 4 committed rows, 2 new windows (none visible)
    q = torch.zeros(T, H, dI, device=device)
    cos, sin = torch.ones(T, 8, device=device), torch.zeros(T, 8, device=device)
    icomp, inew = torch.ones(rows, dI, device=device), torch.ones(win.cur.shape[0], dI, device=device)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    keys = fused.index_keys(q, torch.ones(T, H, device=device), cos, sin, icomp, inew, win.committed, win.visible)
    sel, valid = fused.topk(keys, 7)
    assert sel.tolist() == [[0, 1, 2, 3, 4, 5, 6]]
    assert valid.tolist() == [[True, True, True, True, False, False, False]]


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_and_no_host_sync(monkeypatch, device):
    """The kernel path twice gives the same bytes, and makes no host sync (a CUDA graph can hold it)."""
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    m, dim, T, pos = 4, 32, 1, 13
    w, x, ring_kv, ring_gate = compressor_inputs(m, dim, True, T, torch.float32, device, seed=5)
    rows = 64 // m + 2
    store = torch.zeros(rows, dim, device=device)
    step, win = windows(pos, T, m, ring_kv.shape[0], rows, device)
    q_res, _, wi, icomp, _ = indexer_inputs(T, 16, dim, win.cur.shape[0], rows, device, seed=6)
    cos, sin = step.cos_sin("compress")

    def run():
        entries, _ = run_compress(w, x, ring_kv, ring_gate, store, win, True)
        return entries, *index_topk(q_res, x, cos, sin, wi, icomp, entries, win, 8, 16, dim)

    first = run()
    with NoHostSync():
        second = run()
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_unsupported_shapes_take_the_reference(monkeypatch):
    """A width that is not a power of two, or an ape not in fp32, runs the torch reference."""
    kv = torch.zeros(1, 2 * 24)
    cos = torch.zeros(1, 4)
    assert not fused.pool_supported(kv, torch.zeros(8, 48), torch.zeros(4, 48), torch.ones(24), cos, True)
    assert not fused.pool_supported(torch.zeros(1, 64), torch.zeros(8, 64), torch.zeros(4, 64, dtype=torch.bfloat16),
                                    torch.ones(32), cos, True)
    assert not fused.index_supported(torch.zeros(1, 4, 8), torch.zeros(6, 8), torch.zeros(2, 8), cos)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    device = DEVICES[0]  # CPU only through the interpreter
    w, x, ring_kv, ring_gate = compressor_inputs(4, 24, True, 1, torch.float32, device, seed=1)
    _, win = windows(5, 1, 4, 8, 10, device)
    entries, _ = run_compress(w, x, ring_kv, ring_gate, torch.zeros(10, 24, device=device), win, True)
    assert entries.shape == (win.cur.shape[0], 24)


def test_sort_key_encoding_orders_as_the_stable_sort(monkeypatch):
    """The key encoding on its own, in torch: descending score, ties (and -0.0 == 0.0) by lower index."""
    monkeypatch.setenv("DSV4_KERNELS", "torch")  # CPU tensors: torch.topk even in a DSV4_KERNELS=triton run
    scores = torch.tensor([[0.0, -0.0, 1.5, float("-inf"), -2.0, 1.5, 0.0, float("inf"), -1e-30, 3e-38]])
    bits = torch.where(scores == 0, 0.0, scores).view(torch.int32)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    keys = ((~ordered).to(torch.int64) << 32) | torch.arange(scores.shape[-1])
    sel, valid = fused.topk(keys, scores.shape[-1])
    ref_scores, ref_sel = torch.sort(scores, dim=-1, descending=True, stable=True)
    assert torch.equal(sel, ref_sel) and torch.equal(valid, ref_scores > float("-inf"))
    assert torch.equal(key_scores(keys), torch.where(scores == 0, 0.0, scores))



@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("overlap,m,dim,pos", [(False, 64, 256, 130), (True, 8, 256, 21)])
def test_pool_channel_split_is_bit_identical(monkeypatch, device, overlap, m, dim, pos):
    """Splitting a window's channels over programs (then norm + rope in a second launch) changes no bit."""
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    w, x, ring_kv, ring_gate = compressor_inputs(m, dim, overlap, 1, torch.bfloat16, device, seed=pos)
    rows = 64 // m + 2
    store = torch.zeros(rows, dim, dtype=torch.bfloat16, device=device)
    _, win = windows(pos, 1, m, ring_kv.shape[0], rows, device)
    got = {}
    for split_above in (0, 1 << 30):
        monkeypatch.setattr(fused, "POOL_SPLIT_ABOVE", split_above)
        got[split_above] = run_compress(w, x, ring_kv, ring_gate, store, win, overlap)[0]
    assert torch.equal(got[0], got[1 << 30])
    # the split's norm and rope in its windows' last programs (CONFIG ticket_norm), one pass or two: the same bits,
    # and the tickets back to 0 for the next launch
    monkeypatch.setattr(fused, "POOL_SPLIT_ABOVE", 0)
    from dsv4.kernels import qgemv
    for one_pass in (False, True):
        monkeypatch.setitem(fused.CONFIG, "one_pass", one_pass)
        monkeypatch.setitem(fused.CONFIG, "ticket_norm", True)
        launches = []
        real = fused.launcher
        monkeypatch.setattr(fused, "launcher", lambda fn, t: launches.append(fn.__name__) or real(fn, t))
        assert torch.equal(run_compress(w, x, ring_kv, ring_gate, store, win, overlap)[0], got[0])
        assert launches == ["_pool_kernel"]  # no _norm_rope_kernel
        monkeypatch.setattr(fused, "launcher", real)
        assert int(qgemv.tickets_for(1, torch.device(device)).abs().sum()) == 0


def _pair_arms(monkeypatch, parts, win, ids=None) -> dict:
    """compress_pair of the two parts under each (one_pass, pair) setting -> {(one_pass, pair): (entries, writes)}."""
    got = {}
    for one_pass in (False, True):
        for pair in (False, True):
            monkeypatch.setitem(fused.CONFIG, "one_pass", one_pass)
            monkeypatch.setitem(fused.CONFIG, "pair", pair)
            writes = []
            got[one_pass, pair] = (compress_pair(parts[0], parts[1], win, 1e-6, writes, ids), writes)
    return got


def csa_pair_parts(m: int, pos: int, T: int, dtype, device) -> tuple[list, object]:
    """A CSA layer's two pools' inputs (the compressor's, 32 channels; its indexer's, 16), each (w, ring_kv,
    ring_gate, store, (kv, gate)), and the chunk's windows."""
    parts = []
    for dim, seed in ((32, 1), (16, 2)):
        w, x, ring_kv, ring_gate = compressor_inputs(m, dim, True, T, dtype, device, seed=pos * 31 + T + seed)
        store = torch.zeros(64 // m + 2, dim, dtype=dtype, device=device)
        parts.append((w, ring_kv, ring_gate, store, (x @ w["wkv"].data.T, x @ w["wgate"].data.T)))
    _, win = windows(pos, T, m, parts[0][1].shape[0], parts[0][3].shape[0], device)
    return parts, win


# (pos, T): the first window (its previous half dead), a close, a ring wrap, a chunk touching several windows.
PAIR_CASES = [(0, 1), (3, 1), (9, 1), (14, 3), (2, 7)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pos,T", PAIR_CASES)
def test_pool_one_pass_and_pair_are_bit_identical(monkeypatch, device, dtype, pos, T):
    """A CSA layer's two pools (the compressor's, 32 channels; its indexer's, 16) each launched alone in two passes,
    alone in one pass (CONFIG one_pass), and both in one launch (CONFIG pair, compress_pair) with either: the same
    entries bit for bit and the same staged writes in the same order."""
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    m = 4
    parts, win = csa_pair_parts(m, pos, T, dtype, device)
    got = _pair_arms(monkeypatch, parts, win)
    assert fused.pair_supported((*parts[0][4], *parts[0][1:3], parts[0][0]["ape"], parts[0][0]["norm"]),
                                (*parts[1][4], *parts[1][1:3], parts[1][0]["ape"], parts[1][0]["norm"]), win, True)
    (base, base_writes) = got[False, False]
    for key, (entries, writes) in got.items():
        assert all(torch.equal(a, b) for a, b in zip(entries, base)), key
        assert [w.buf for w in writes] == [w.buf for w in base_writes], key
        for a, b in zip(writes, base_writes):
            assert torch.equal(a.index, b.index) and torch.equal(a.rows, b.rows)
            assert (a.keep is None) == (b.keep is None) and (a.keep is None or torch.equal(a.keep, b.keep))
    # and the two-pass pair equals the reference within the pool's tolerance (test_pool's)
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    ref = compress_pair(parts[0], parts[1], win, 1e-6, [])
    close = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2 ** -7, atol=1e-5)
    for a, b in zip(base, ref):
        torch.testing.assert_close(a.float(), b.float(), **close)


@pytest.mark.parametrize("device", DEVICES)
def test_pooled_pool_pair_is_bit_identical(monkeypatch, device):
    """The pooled step's pair (3 rows of a pool of 4 slots, each row its own window): the entries and the staged
    writes of the two launches."""
    from dsv4.model.step import PoolStep

    monkeypatch.setenv("DSV4_KERNELS", "triton")
    m, B, slots, dtype = 4, 3, 4, torch.bfloat16
    ids = torch.tensor([2, 0, 3], device=device)
    step = PoolStep(torch.tensor([5, 0, 11], device=device), ids, Rope(CFG, device), CFG.sliding_window)
    g = torch.Generator().manual_seed(7)
    parts = []
    for dim in (32, 16):
        width, R = 2 * dim, 2 * m
        rnd = lambda *s: torch.randn(*s, generator=g).to(dtype).to(device)  # noqa: E731
        w = {"ape": torch.randn(m, width, generator=g).to(device),
             "norm": (torch.rand(dim, generator=g) + 0.5).to(device)}
        store = torch.zeros(slots, 10, dim, dtype=dtype, device=device)
        parts.append((w, rnd(slots, R, width), rnd(slots, R, width), store, (rnd(B, width), rnd(B, width))))
    win = step.windows(m, 2 * m, 10)
    got = _pair_arms(monkeypatch, parts, win, ids)
    base, base_writes = got[False, False]
    for key, (entries, writes) in got.items():
        assert all(torch.equal(a, b) for a, b in zip(entries, base)), key
        assert len(writes) == len(base_writes) == 6
        for a, b in zip(writes, base_writes):
            assert a.buf.data_ptr() == b.buf.data_ptr() and torch.equal(a.index, b.index)
            assert torch.equal(a.rows, b.rows)


# A tiny model through every kernel: minutes under the interpreter, so its CPU case joins the slow set (DSV4_SLOW=1);
# on a GPU machine the CUDA case runs.
MODEL_DEVICES = [pytest.param(d, marks=[pytest.mark.slow] if d == "cpu" else []) for d in DEVICES]


@pytest.mark.parametrize("device", MODEL_DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_model_pool_switches_and_xproj_first_change_no_bit(monkeypatch, device, dtype):
    """tiny's decode steps with the pools in one pass and paired (compressor CONFIG one_pass, pair) and the stacked
    x linear launched first (layout xproj_first): the logits and the state's bytes of the defaults' launches, bit
    for bit; one paired launch a CSA layer a step."""
    import dsv4
    from dsv4.config import CSA
    from dsv4.layout import CONFIG as LAYOUT

    model = dsv4.load("tiny", device=device, dtype=dtype, seed=6)
    launched = []
    real = fused.pool_pair
    monkeypatch.setattr(fused, "pool_pair", lambda *a, **k: launched.append(1) or real(*a, **k))

    def run(on):
        monkeypatch.setitem(fused.CONFIG, "one_pass", on)
        monkeypatch.setitem(fused.CONFIG, "pair", on)
        monkeypatch.setitem(LAYOUT, "xproj_first", on)
        return decode_twice(model, monkeypatch)

    (on, on_digest), (off, off_digest) = run(True), run(False)
    assert len(launched) == 2 * sum(t == CSA for t in model.cfg.layer_types)
    assert torch.equal(on, off) and on_digest == off_digest


# ---- the pools and the index keys before their PDL wait (CONFIG early) ------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pos,T", [(0, 1), (9, 1), (14, 3)])
def test_pool_early_keeps_the_bits(monkeypatch, device, pos, T):
    """early (the caller's word that the pools' inputs are two or more kernels back): the pair's entries, a lone
    pool's (one pass and two) and a channel-split pool's (norm in the second launch, or by ticket) are the plain
    launches' bits; the caller's word without the switch changes nothing."""
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    m, dtype = 4, torch.bfloat16
    parts, win = csa_pair_parts(m, pos, T, dtype, device)

    def arms():
        got = []
        for pair in (True, False):
            monkeypatch.setitem(fused.CONFIG, "pair", pair)
            for one_pass in (True, False):
                monkeypatch.setitem(fused.CONFIG, "one_pass", one_pass)
                got += compress_pair(parts[0], parts[1], win, 1e-6, [], early=True)
        return got

    plain = arms()
    monkeypatch.setitem(fused.CONFIG, "early", True)
    assert all(torch.equal(a, b) for a, b in zip(arms(), plain))
    # HCA's shape: one window's 64 slots x 256 channels split over programs
    w, x, ring_kv, ring_gate = compressor_inputs(64, 256, False, 1, dtype, device, seed=pos)
    store = torch.zeros(3, 256, dtype=dtype, device=device)
    _, win = windows(130 + pos, 1, 64, ring_kv.shape[0], 3, device)
    proj = (x @ w["wkv"].data.T, x @ w["wgate"].data.T)
    got = {}
    for early in (False, True):
        monkeypatch.setitem(fused.CONFIG, "early", early)
        for ticket in (False, True):
            monkeypatch.setitem(fused.CONFIG, "ticket_norm", ticket)
            got[early, ticket] = compress(x, w, ring_kv, ring_gate, store, win, False, 1e-6, [], proj, early=True)
    assert all(torch.equal(v, got[False, False]) for v in got.values())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pos,T,m,H,dI,topk", [INDEX_CASES[1], INDEX_CASES[3]])
def test_index_keys_early_keep_the_bits(monkeypatch, device, pos, T, m, H, dI, topk):
    """early (all but the new keys before the wait): the sort keys of the plain launch, bit for bit."""
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    rows = 64 // m + 2
    step, win = windows(pos, T, m, 2 * m, rows, device)
    q_res, x, w, icomp, inew = indexer_inputs(T, H, dI, win.cur.shape[0], rows, device, seed=pos + T)
    cos, sin = step.cos_sin("compress")
    q = (q_res @ w["wq_b"].data.T).view(T, H, dI)
    weights = x @ w["weights_proj"].data.T
    plain = fused.index_keys(q, weights, cos, sin, icomp, inew, win.committed, win.visible)
    monkeypatch.setitem(fused.CONFIG, "early", True)
    assert torch.equal(fused.index_keys(q, weights, cos, sin, icomp, inew, win.committed, win.visible, early=True),
                       plain)
    assert torch.equal(index_topk(q_res, x, cos, sin, w, icomp, inew, win, topk, H, dI, (q, weights), early=True)[0],
                       index_topk(q_res, x, cos, sin, w, icomp, inew, win, topk, H, dI, (q, weights))[0])


@pytest.mark.parametrize("device", MODEL_DEVICES)
def test_model_early_pools_change_no_bit(monkeypatch, device):
    """tiny's decode steps with the compressor's pools and index keys starting on their inputs before their PDL wait
    (CONFIG early, where dsv4.model.attention says so): the logits and the state's bytes of the plain launches, bit
    for bit; every compressed layer's pool told so."""
    import dsv4

    model = dsv4.load("tiny", device=device, dtype=torch.bfloat16, seed=8)
    said = []
    real = fused.pool_pair, fused.pool
    monkeypatch.setattr(fused, "pool_pair", lambda *a, **k: said.append(k.get("early")) or real[0](*a, **k))
    monkeypatch.setattr(fused, "pool", lambda *a, **k: said.append(k.get("early")) or real[1](*a, **k))

    def run(on):
        monkeypatch.setitem(fused.CONFIG, "early", on)
        monkeypatch.setenv("DSV4_KERNELS", "torch")
        state = model.new_state(16)
        model.prefill(state, [3, 1, 4, 1, 5])
        monkeypatch.setenv("DSV4_KERNELS", "triton")
        logits = [model.decode(state, 9).reshape(-1)]
        for _ in range(3):
            logits.append(model.decode(state, int(logits[-1].argmax())).reshape(-1))
        return torch.stack(logits), model.digests(state)

    (on, on_digest), (off, off_digest) = run(True), run(False)
    assert torch.equal(on, off) and on_digest == off_digest
    compressed = sum(m > 0 for m in map(model.cfg.compress_rate, range(model.cfg.num_hidden_layers)))
    assert said == [True] * (2 * 4 * compressed)  # one pool launch a compressed layer a step, each told early
