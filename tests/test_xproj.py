"""A compressed layer's bf16 linears of the attention's input x stacked into one weight at load (dsv4.layout CONFIG
fuse_xproj, DSV4_FUSE_XPROJ=1): one linear over all of them, split into column views that every consumer reads in
place (strided rows).

What is compared:
- the kernels that read the views (the compressor's pool, plain and pooled; the indexer's keys, plain and pooled;
  the commit, one launch per step and one per write) on column views of a wider tensor: bit for bit the same
  kernels on contiguous copies of the same values (the same operations; only the addresses differ);
- the load: the stacked weight holds the parts' rows in attention.X_PROJ's order, the official names hold views of
  it with the unstacked model's values (the oracle and checkpoint code read them), sliding layers stack nothing;
- the model (tiny: 2 CSA and 2 HCA layers) with the switch on against off: the same greedy tokens and logits within
  1e-5 of the largest (the stacked GEMV's split-K follows its row count, so a row's sums may be ordered otherwise;
  on CPU they came out bit-equal), over a prefill of short chunks, one chunk past the rows-alone limit (GEMMs) and
  decode steps; on the torch reference (DSV4_KERNELS=torch) and on the kernels (triton: slow set on CPU);
- with the switch on, batched == solo (each row's tokens and committed bytes are its sequence's stepped alone),
  and 1 rank == 2 ranks (gloo, the reference path, both ranks read DSV4_FUSE_XPROJ at import).
Eager == graph and the pooled step run the same kernels in both arms: tests/test_replay_gpu.py and tests/test_pool.py,
run with DSV4_FUSE_XPROJ=1 (benchmarks/gpu_xproj_checks.sh), cover them.
"""

from __future__ import annotations

import pytest
import torch

import dsv4
from batching import assert_batched_equals_solo
from dsv4 import SamplingParams, kernels
from dsv4.checkpoint.synth import synth
from dsv4.config import CSA, preset
from dsv4.kernels import commit as commit_kernel
from dsv4.kernels import commit_step
from dsv4.kernels import compressor as fused
from dsv4.model import attention
from dsv4.model.commit import Write
from dsv4.model.rope import Rope
from dsv4.model.step import PoolStep, Step

pytest.importorskip("triton")

DEVICES = (["cpu"] if kernels.interpreting() else []) + (["cuda"] if torch.cuda.is_available() else [])
CFG = preset("tiny")
TOL = 1e-5  # of the largest logit, fp32 (tests/test_qkvfuse.py's)
# The kernels' whole-model cases cost minutes under the interpreter: on CPU they are in the slow set.
MODES = ["torch", pytest.param("triton", marks=[pytest.mark.slow] if not torch.cuda.is_available() else [])]
# batched == solo: on CUDA the kernels only (the GPU's decode path; the reference's rows-alone promise is CPU's here)
BATCH_MODES = ["triton"] if torch.cuda.is_available() else MODES
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _columns(gen, rows: int, widths: list[int], dtype, device) -> list[torch.Tensor]:
    """Column views of one [rows, sum(widths) + 3] tensor (the 3 extra columns: a stride no part's width)."""
    wide = torch.randn(rows, sum(widths) + 3, generator=gen).to(dtype).to(device)
    return list(wide.split(widths + [3], dim=-1)[:-1])


# ---- the kernels on column views ------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("overlap,m,pos,T", [(True, 4, 14, 3), (True, 4, 2, 7), (False, 16, 30, 20)])
def test_pool_reads_column_views_in_place(device, dtype, overlap, m, pos, T):
    gen = torch.Generator().manual_seed(pos + T)
    dim, rows = 32, 64 // m + 2
    width, R = (2 * dim, 2 * m) if overlap else (dim, m)
    kv, gate = _columns(gen, T, [width, width], dtype, device)
    assert not kv.is_contiguous() and fused.pool_supported(kv, torch.zeros(R, width, dtype=dtype, device=device),
                                                           torch.zeros(m, width), torch.ones(dim), torch.zeros(1, 8),
                                                           overlap)
    ring_kv, ring_gate = (torch.randn(R, width, generator=gen).to(dtype).to(device) for _ in range(2))
    ape, norm = torch.randn(m, width, generator=gen).to(device), (torch.rand(dim, generator=gen) + 0.5).to(device)
    win = Step(torch.tensor(pos, device=device), T, Rope(CFG, device), CFG.sliding_window).windows(m, R, rows)
    run = lambda k, g: fused.pool(k, g, ring_kv, ring_gate, ape, norm, win, overlap, 1e-6)  # noqa: E731
    assert torch.equal(run(kv, gate), run(kv.contiguous(), gate.contiguous()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("overlap,m", [(True, 4), (False, 16)])
def test_pooled_pool_reads_column_views_in_place(device, overlap, m):
    gen = torch.Generator().manual_seed(m)
    dim, slots, rows = 32, 4, 12
    width, R = (2 * dim, 2 * m) if overlap else (dim, m)
    ids = torch.tensor([1, 3, 0], device=device)
    kv, gate = _columns(gen, 3, [width, width], torch.float32, device)
    ring_kv, ring_gate = (torch.randn(slots, R, width, generator=gen).to(device) for _ in range(2))
    ape, norm = torch.randn(m, width, generator=gen).to(device), (torch.rand(dim, generator=gen) + 0.5).to(device)
    step = PoolStep(torch.tensor([14, 3, 31], device=device), ids, Rope(CFG, device), CFG.sliding_window)
    win = step.windows(m, R, rows)
    run = lambda k, g: fused.pool(k, g, ring_kv, ring_gate, ape, norm, win, overlap, 1e-6, ids=ids)  # noqa: E731
    assert torch.equal(run(kv, gate), run(kv.contiguous(), gate.contiguous()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pooled", [False, True])
def test_index_keys_read_head_weights_in_place(device, pooled):
    """The head weights a column view (weights_proj's part of the stacked output; x's other parts beside it)."""
    gen = torch.Generator().manual_seed(7)
    T, H, dI, m, rows, slots = 3, 16, 32, 4, 10, 4
    q = torch.randn(T, H, dI, generator=gen).to(device)
    _, weights = _columns(gen, T, [40, H], torch.float32, device)
    ids = torch.tensor([2, 0, 3], device=device) if pooled else None
    if pooled:
        step = PoolStep(torch.tensor([14, 3, 31], device=device), ids, Rope(CFG, device), CFG.sliding_window)
    else:
        step = Step(torch.tensor(17, device=device), T, Rope(CFG, device), CFG.sliding_window)
    win, (cos, sin) = step.windows(m, 2 * m, rows), step.cos_sin("compress")
    icomp = torch.randn(*((slots,) if pooled else ()), rows, dI, generator=gen).to(device)
    inew = torch.randn(*((T, 1) if pooled else (win.cur.shape[0],)), dI, generator=gen).to(device)
    run = lambda w: fused.index_keys(q, w, cos, sin, icomp, inew, win.committed, win.visible, ids=ids)  # noqa: E731
    assert not weights.is_contiguous() and torch.equal(run(weights), run(weights.contiguous()))


@pytest.mark.parametrize("device", DEVICES)
def test_commits_read_column_views_in_place(monkeypatch, device):
    """A step's ring writes of the compressor's kv and gate (column views), in one launch and one per write."""
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    gen = torch.Generator().manual_seed(3)
    kv, gate = _columns(gen, 5, [24, 24], torch.float32, device)
    keep = torch.tensor([True, False, True, True, True], device=device)

    def writes(rows):
        bufs = [torch.zeros(8, 24, device=device), torch.zeros(8, 24, dtype=torch.bfloat16, device=device)]
        index = torch.tensor([6, 1, 0, 3, 7], device=device)
        return [Write(buf, index, r, keep) for buf, r in zip(bufs, rows)]

    want = writes([kv.contiguous(), gate.contiguous()])
    commit_step.commit(want, torch.zeros((), device=device))
    got = writes([kv, gate])
    assert commit_step.supported(got)
    commit_step.commit(got, torch.zeros((), device=device))
    alone = writes([kv, gate])
    for w in alone:
        assert commit_kernel.supported(w.buf, w.index, w.rows)
        commit_kernel.commit(w.buf, w.index, w.rows, w.keep, torch.zeros((), device=device))
    for a, b, c in zip(want, got, alone):
        assert torch.equal(a.buf, b.buf) and torch.equal(a.buf, c.buf) and a.buf.abs().sum() > 0


# ---- the model ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return synth(CFG, tmp_path_factory.mktemp("xproj") / "tiny", seed=11, quant="none")


def _load(source, fuse: bool, monkeypatch, device=DEVICE, **kw):
    monkeypatch.setitem(attention.CONFIG, "fuse_xproj", fuse)
    return dsv4.load(source, device=device, dtype=torch.float32, seed=3, **kw)


def test_load_stacks_the_compressed_layers_linears_of_x(monkeypatch):
    plain, fused_model = (_load("tiny", on, monkeypatch) for on in (False, True))
    names = {("compressor", "wkv"): "compressor.wkv", ("compressor", "wgate"): "compressor.wgate",
             ("indexer", "wkv"): "indexer.compressor.wkv", ("indexer", "wgate"): "indexer.compressor.wgate",
             ("indexer", "weights_proj"): "indexer.weights_proj"}
    for i, layer in enumerate(fused_model.transformer.layers):
        w = layer["attn"]
        assert "x_proj" not in plain.transformer.layers[i]["attn"]
        if not CFG.compress_rate(i):
            assert "x_proj" not in w
            continue
        parts = [key for key in attention.X_PROJ if key[0] in w]
        assert len(parts) == (5 if CFG.layer_types[i] == CSA else 2)
        stacked = w["x_proj"].data
        assert stacked.shape == (sum(w[o][n].shape[0] for o, n in parts), CFG.hidden_size)
        row = 0
        for owner, name in parts:
            official = fused_model.transformer.weights[f"layers.{i}.attn.{names[owner, name]}.weight"]
            assert official is w[owner][name] and official.data.data_ptr() == stacked[row].data_ptr()
            want = plain.transformer.weights[f"layers.{i}.attn.{names[owner, name]}.weight"]
            assert torch.equal(official.data, want.data)
            row += official.shape[0]


def _run(model, prompt: list[int], chunk: int):
    state = model.new_state(len(prompt) + 8)
    logits = [model.prefill(state, prompt, chunk_size=chunk)]
    for token in (12, 13, 14):
        logits.append(model.decode(state, token))
    return torch.stack(logits)


@pytest.mark.parametrize("mode", MODES)
def test_model_with_the_switch_against_without(monkeypatch, mode):
    """Short chunks (rows alone), then a chunk of 140 tokens (past rows_alone: the stacked GEMM), then decode."""
    monkeypatch.setenv("DSV4_KERNELS", mode)
    plain, fused_model = (_load("tiny", on, monkeypatch) for on in (False, True))
    for prompt, chunk in (([3, 4, 5, 6, 7], 2), ([(7 * i) % 500 + 1 for i in range(140)], 140)):
        want, got = _run(plain, prompt, chunk), _run(fused_model, prompt, chunk)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
        torch.testing.assert_close(got, want, rtol=0, atol=TOL * float(want.abs().max()))


@pytest.mark.parametrize("mode", BATCH_MODES)
def test_batched_equals_solo_with_the_switch(monkeypatch, mode):
    """A batched step's 2 rows (the views strided) each equal their sequence stepped alone, tokens and bytes."""
    monkeypatch.setenv("DSV4_KERNELS", mode)
    model = _load("tiny", True, monkeypatch)
    prompts = [list(range(20, 34)), [5, 6, 7]]  # decode from 13 (CSA and HCA windows close at 15) and from 2
    samplings = [SamplingParams(temperature=t, seed=i) for i, t in enumerate([1.0, 0.0])]

    assert_batched_equals_solo(model, prompts, samplings, 3)


def test_two_ranks_match_one_rank_with_the_switch(monkeypatch, ckpt):
    """tests/test_parallel.py's check on CPU (gloo, the reference path; relative logit error <= 1e-4, replicated
    caches equal over ranks), both models stacked: the spawned rank reads DSV4_FUSE_XPROJ at import."""
    monkeypatch.setenv("DSV4_FUSE_XPROJ", "1")
    monkeypatch.setenv("DSV4_KERNELS", "auto")
    one = _load(ckpt, True, monkeypatch, device="cpu")
    two = _load(ckpt, True, monkeypatch, device="cpu", ranks=2)
    try:
        prompt = [0, 5, 17, 42, 99]
        s1, s2 = one.new_state(40), two.new_state(40)
        for step, token in enumerate([None] + list(range(11, 35))):
            a = one.prefill(s1, prompt) if token is None else one.decode(s1, token)
            b = two.prefill(s2, prompt) if token is None else two.decode(s2, token)
            err = float((a - b).abs().max() / a.abs().max())
            assert err <= 1e-4, f"step {step}: relative logit error {err:.2e}"
        per_rank = two.digests_all(s2)
        assert per_rank[0] == per_rank[1]
    finally:
        two.close()
