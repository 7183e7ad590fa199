"""DSV4_PREFILL_STORE_LIMIT=1: a prefill chunk's kernels score only the compressed rows committed before it
(model.step.Step.scored_rows), and every result is the same bit for bit.

The indexer's kernel path (dsv4.kernels.compressor index_keys + top-k) over the store's prefix, its picks
mapped back to the whole store's index space (model.compressor._as_whole_store), against the whole store:
sel and valid equal (torch.equal), on random and tied scores, first chunks whose prefix holds fewer entries
than top-k, and queries with fewer visible entries than top-k. HCA's rows cut for the prefill attention
kernel (model.attention._scored): equal outputs, with and without its tile skipping. A model's prefill
(capacity far above the prompt, chunk sizes, unaligned starts) with the limit against without it: logits
and the state digest equal, with the kernels (interpreter on CPU) and with the torch reference (which the
limit leaves as it is). Small STORE_BLOCK and index tiles here, so that small stores get cut.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dsv4 import kernels
from dsv4.checkpoint.init import random_weights
from dsv4.config import HCA, preset
from dsv4.engine import Model
from dsv4.formats import QWeight
from dsv4.kernels import compressor as index_kernel
from dsv4.kernels import prefill_attention as pattn
from dsv4.model import attention as attention_mod
from dsv4.model import compressor as compressor_mod
from dsv4.model import step as step_mod
from dsv4.model.forward import Transformer
from dsv4.model.rope import Rope
from dsv4.model.step import Step
from dsv4.parallel import Comm

pytest.importorskip("triton")

DEVICE = "cpu" if kernels.interpreting() else "cuda"
CFG = preset("tiny")


@pytest.fixture
def small_tiles(monkeypatch):
    """STORE_BLOCK 32 and index_keys' tiles of 32 rows: stores of a few dozen rows get cut."""
    monkeypatch.setattr(step_mod, "STORE_BLOCK", 32)
    monkeypatch.setattr(index_kernel, "INDEX_BLOCK", 32)
    monkeypatch.setattr(attention_mod, "INDEX_BLOCK", 32)
    monkeypatch.setenv("DSV4_PREFILL_STORE_LIMIT", "1")


def step_at(pos: int, T: int, device=DEVICE) -> Step:
    return Step(torch.tensor(pos, device=device), T, Rope(CFG, device), CFG.sliding_window, host_pos=pos)


def test_scored_rows(monkeypatch):
    monkeypatch.setenv("DSV4_PREFILL_STORE_LIMIT", "1")
    for rows in (258, 1026, 32802):
        for pos in (0, 3, 4, 1023, 1024, 4100, 40000, 131000):
            c = min(pos // 4, rows)
            n = step_at(pos, 9, "cpu").scored_rows(4, rows, 64)
            assert step_at(pos, 9, "cpu").committed_rows(4, rows) == c
            assert n == rows or ((rows - n) % 256 == 0 and n - rows % 256 >= c and n - rows % 256 - c < 256)
    assert step_at(40, 9, "cpu").scored_rows(4, 1026, 64) == 256 + 2
    assert step_at(40, 9, "cpu").scored_rows(4, 1026, 512) == 1026  # STORE_BLOCK not a multiple of the tile
    assert step_at(40, 8, "cpu").host_pos is None  # decode-sized chunks: static shapes
    monkeypatch.setenv("DSV4_PREFILL_STORE_LIMIT", "0")
    assert step_at(40, 9, "cpu").host_pos is None and step_at(40, 9, "cpu").scored_rows(4, 1026, 64) == 1026


def indexer_inputs(T, H, dI, n_win, rows, seed, tied):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g).to(DEVICE)  # noqa: E731
    icomp, inew = rnd(rows, dI), rnd(n_win, dI)
    if tied:  # every stored row alike: the visible scores tie, the picks go to the lowest indices
        icomp = icomp[:1].expand(rows, dI).contiguous()
    w = {"wq_b": QWeight(rnd(H * dI, 32) * 0.3), "weights_proj": QWeight(rnd(H, 64) * 0.3)}
    return rnd(T, 32), rnd(T, 64), w, icomp, inew


# (pos, T, rows, topk, tied): first chunks (no committed row; the prefix holds fewer entries than top-k),
# queries seeing fewer entries than top-k (the whole store's uncommitted rows, then invisible new windows,
# fill the rest), stores cut to one block or several or to nothing, a prefix ending next to the store's end,
# unaligned starts.
INDEX_CASES = [(0, 9, 98, 8, False), (0, 10, 96, 8, False), (0, 12, 99, 64, True), (5, 9, 98, 8, True),
               (37, 11, 98, 16, False), (130, 13, 98, 64, False), (250, 10, 100, 8, True), (400, 9, 162, 64, False),
               (61, 20, 97, 40, False)]


@pytest.mark.parametrize("pos,T,rows,topk,tied", INDEX_CASES)
def test_index_topk_over_the_prefix_is_the_whole_stores(monkeypatch, small_tiles, pos, T, rows, topk, tied):
    m, H, dI = 4, 4, 32
    step = step_at(pos, T)
    win = step.windows(m, 2 * m, rows)
    n, c = step.scored_rows(m, rows, index_kernel.INDEX_BLOCK), step.committed_rows(m, rows)
    assert n < rows  # the cases cut the store
    q_res, x, w, icomp, inew = indexer_inputs(T, H, dI, win.cur.shape[0], rows, pos + rows + topk, tied)
    cos, sin = step.cos_sin("compress")
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    run = lambda prefix: compressor_mod.index_topk(  # noqa: E731
        q_res, x, cos, sin, w, icomp, inew, win, topk, H, dI, prefix=prefix)
    whole_sel, whole_valid = run(None)
    sel, valid = run((n, c))
    assert torch.equal(sel, whole_sel) and torch.equal(valid, whole_valid)


def hca_case(pos, T, rows, seed):
    g = torch.Generator().manual_seed(seed)
    H, hd, W = 4, CFG.head_dim, CFG.sliding_window
    rand = lambda *s: torch.randn(*s, generator=g).to(DEVICE)  # noqa: E731
    step = step_at(pos, T)
    visible, _ = step.sliding()
    win = step.windows(16, 16, rows)
    args = (rand(T, H, hd) * 3, rand(W, hd), rand(T, hd), visible, rand(H) * 2, *step.cos_sin("compress"))
    return step, args, dict(comp=rand(rows, hd), new=rand(win.wids.shape[0], hd), committed=win.committed,
                            new_visible=win.visible)


@pytest.mark.parametrize("pos,T,rows,skip_rows", [(0, 9, 66, True), (0, 10, 64, False), (20, 12, 66, False),
                                                   (100, 12, 67, True), (513, 9, 130, False), (700, 10, 99, True)])
def test_hca_rows_cut_for_the_prefill_kernel(monkeypatch, small_tiles, pos, T, rows, skip_rows):
    monkeypatch.setitem(pattn.CONFIG, "skip_rows", skip_rows)
    step, args, extra = hca_case(pos, T, rows, seed=pos + rows)
    cut = attention_mod._scored(extra, step, 16)
    assert cut["comp"].shape[0] == step.scored_rows(16, rows, pattn.CONFIG["block_n"]) < rows
    assert torch.equal(pattn.attention(*args, **cut), pattn.attention(*args, **extra))


_MARK = object()


class _KernelsOnly:
    """model.attention's and model.compressor's view of dsv4.kernels: Triton for the kernels whose GPU_CHECKED
    the test marks (the indexer's and compressor's, the prefill attention's), the rest on the torch reference."""
    @staticmethod
    def use_triton(t, gpu_checked=True):
        return gpu_checked is _MARK


@pytest.fixture(scope="module")
def model():
    """tiny cut to its CSA and HCA layers, 4 indexer heads: the interpreter's work per chunk stays small."""
    cfg = dataclasses.replace(CFG, num_hidden_layers=2, layer_types=CFG.layer_types[1:3],
                              mlp_layer_types=CFG.mlp_layer_types[1:3], index_n_heads=4)
    dev = torch.device(DEVICE)
    weights = random_weights(cfg, device=dev, dtype=torch.float32, seed=3)
    return Model(cfg, Transformer(cfg, weights, Comm(cfg.num_hidden_layers, dev), dev, torch.float32))


CAPACITY = 768  # far above the prompts: stores of 194 (CSA) and 50 (HCA) rows
STREAM = torch.randint(2, 512, (80,), generator=torch.Generator().manual_seed(4)).tolist()


@torch.inference_mode()
def prefill(model, plan, limit: bool, monkeypatch, capacity=CAPACITY):
    """Prefill STREAM in parts (tokens, chunk) on a fresh state: (each part's logits, the state's digest)."""
    monkeypatch.setenv("DSV4_PREFILL_STORE_LIMIT", "1" if limit else "0")
    state, start, out = model.new_state(capacity), 0, []
    for n, chunk in plan:
        out.append(model.prefill(state, STREAM[start:start + n], chunk_size=chunk))
        start += n
    return out, state.digest()


# Chunks over both rates and the window; unaligned starts; a decode-sized chunk (5: never cut) between.
PLANS = [((17, 17), (24, 12), (5, 5), (10, 10)), ((27, 9),)]


@pytest.mark.parametrize("plan", PLANS)
def test_model_prefill_with_the_limit_is_bit_identical(monkeypatch, small_tiles, model, plan):
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    monkeypatch.setattr(attention_mod, "kernels", _KernelsOnly)
    monkeypatch.setattr(compressor_mod, "kernels", _KernelsOnly)
    monkeypatch.setattr(pattn, "GPU_CHECKED", _MARK)
    monkeypatch.setattr(index_kernel, "GPU_CHECKED", _MARK)
    scored, keys, attend = [], index_kernel.index_keys, pattn.attention
    monkeypatch.setattr(index_kernel, "index_keys", lambda q, w, c, s, icomp, *a, **kw: scored.append(
        ("csa", icomp.shape[0])) or keys(q, w, c, s, icomp, *a, **kw))
    monkeypatch.setattr(pattn, "attention", lambda *a, **k: (
        "committed" in k and scored.append(("hca", k["comp"].shape[0]))) or attend(*a, **k))
    whole = prefill(model, plan, False, monkeypatch)
    rows = {"csa": CAPACITY // 4 + 2, "hca": CAPACITY // 16 + 2}
    assert all(n == rows[kind] for kind, n in scored)
    scored.clear()
    cut = prefill(model, plan, True, monkeypatch)
    assert all(n <= rows[kind] for kind, n in scored)
    assert {kind for kind, n in scored if n < rows[kind]} == {"csa", "hca"}  # both stores were cut
    assert all(torch.equal(a, b) for a, b in zip(cut[0], whole[0])) and cut[1] == whole[1]
    if DEVICE == "cpu":  # on CUDA the fp32 reference's grouped matmul loop reads its group ends (not capturable)
        scored.clear()  # a chunk's transaction under NoHostSync: the cut shapes come from the host's position
        model.check_capturable(model.new_state(CAPACITY), STREAM[:20])
        assert scored and scored[0][1] < rows[scored[0][0]]


def test_model_prefill_on_the_reference_is_unchanged(monkeypatch, small_tiles, model):
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    whole, cut = (prefill(model, PLANS[0], limit, monkeypatch) for limit in (False, True))
    assert all(torch.equal(a, b) for a, b in zip(cut[0], whole[0])) and cut[1] == whole[1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("plan", [((1200, 512),), ((300, 100), (77, 77), (900, 257))])
def test_tiny_bf16_on_cuda_every_kernel_the_default_tiles(monkeypatch, plan):
    """tiny, bf16, every kernel (DSV4_KERNELS=triton), STORE_BLOCK 256 and the kernels' own tiles, a state of
    8,192 tokens (stores of 2,050 and 514 rows): logits and the state digest equal with the limit and without."""
    import dsv4

    monkeypatch.setenv("DSV4_KERNELS", "triton")
    model = dsv4.load("tiny", device="cuda", dtype=torch.bfloat16, seed=3)
    stream = torch.randint(2, 512, (1300,), generator=torch.Generator().manual_seed(5)).tolist()

    def run(limit):
        monkeypatch.setenv("DSV4_PREFILL_STORE_LIMIT", "1" if limit else "0")
        state, start, out = model.new_state(8192), 0, []
        with torch.inference_mode():
            for n, chunk in plan:
                out.append(model.prefill(state, stream[start:start + n], chunk_size=chunk))
                start += n
        return out, state.digest()

    whole, cut = run(False), run(True)
    assert all(torch.equal(a, b) for a, b in zip(cut[0], whole[0])) and cut[1] == whole[1]
