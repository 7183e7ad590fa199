"""dsv4.kernels.undo (a verify step's writes in one launch a row, their taking back in one a step) against the torch
ops of dsv4.model.commit.Undo, in Triton's interpreter on CPU (and on CUDA where there is one): the same bytes in
every buffer after each apply and after the take-back, for writes with and without keep masks, rows of other dtypes
(converted as torch's .to), strided rows (a column view), and several rows writing one store row. Then whole verify
steps with CONFIG fused: the plain stream, bit for bit.
"""

from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4 import kernels
from dsv4.kernels import undo as fused_undo
from dsv4.model.commit import Undo, Write

# CPU tensors through the kernels need Triton's interpreter (CI's; on the GPU machine the CUDA cases run instead)
DEVICES = (["cpu"] if kernels.interpreting() else []) + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture
def kernels_on(monkeypatch):
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    monkeypatch.setitem(fused_undo.CONFIG, "fused", True)


def buffers(device, g):
    """A step's buffers of each dtype: a window ring, a compressor ring, a store (bf16 model), an fp32 ring."""
    return {"win": torch.randn(8, 64, generator=g).to(device, torch.bfloat16),
            "ring": torch.randn(8, 2, 32, generator=g).to(device, torch.bfloat16),
            "store": torch.randn(6, 64, generator=g).to(device, torch.bfloat16),
            "f32": torch.randn(8, 48, generator=g).to(device)}


def row_writes(bufs, r, device, g):
    """Row r's writes: its window slot, its ring slot (rows a column view of a wider fp32 output, converted), the
    store row of its window (kept only at the closing row), an fp32 ring slot."""
    i64 = dict(dtype=torch.int64, device=device)
    wide = torch.randn(1, 3 * 64, generator=g).to(device)
    return [Write(bufs["win"], torch.tensor([r % 8], **i64), torch.randn(1, 64, generator=g).to(device, torch.bfloat16)),
            Write(bufs["ring"], torch.tensor([(r + 3) % 8], **i64), wide[:, 64:128].view(1, 2, 32)),
            Write(bufs["store"], torch.tensor([2 + r // 4], **i64),
                  torch.randn(1, 64, generator=g).to(device, torch.bfloat16),
                  torch.tensor([r % 4 == 3], device=device)),
            Write(bufs["f32"], torch.tensor([(r + 5) % 8], **i64), torch.randn(1, 48, generator=g).to(device))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("accepted", [0, 2, 5])
def test_fused_undo_is_the_torch_undo(device, accepted, kernels_on, monkeypatch):
    R = 6
    out, launches = [], []
    for name in ("apply", "take_back"):  # count the kernels' launches: the fused arm must not fall back
        real = getattr(fused_undo, name)
        monkeypatch.setattr(fused_undo, name, lambda *a, real=real, name=name: (launches.append(name), real(*a)))
    for fused in (False, True):
        monkeypatch.setitem(fused_undo.CONFIG, "fused", fused)
        g = torch.Generator().manual_seed(5)
        bufs = buffers(device, g)
        before = {k: v.clone() for k, v in bufs.items()}
        undo, seen = Undo(), []
        for r in range(R):
            undo.apply(row_writes(bufs, r, device, g), r)
            seen.append({k: v.clone() for k, v in bufs.items()})
        kept = torch.arange(R, device=device) <= accepted
        undo.take_back(kept)
        out.append((seen, {k: v.clone() for k, v in bufs.items()}, before))
    assert launches == ["apply"] * R + ["take_back"]  # one launch a row, one for the take-back
    for r in range(R):
        for k in out[0][0][r]:
            assert torch.equal(out[0][0][r][k], out[1][0][r][k]), f"after row {r}'s apply, {k}"
    for k in out[0][1]:
        assert torch.equal(out[0][1][k], out[1][1][k]), f"after the take-back, {k}"
    if accepted == 0:  # nothing but row 0 kept: every buffer as row 0 left it
        assert all(torch.equal(out[1][1][k], out[1][0][0][k]) for k in out[1][1])


def chunk_writes(bufs, R, device, g):
    """Rows 0..R-1's writes as one chunk's (model.attention._in_chunk): a write of R window slots, each index row its
    verify row's, and a store write of the two windows the rows touch (the first kept, closed by row 1; the second
    open, its keep False) -> (writes, tags: a device tensor of the row behind each index)."""
    i64 = dict(dtype=torch.int64, device=device)
    win = Write(bufs["win"], torch.arange(3, 3 + R, **i64) % 8,
                torch.randn(R, 64, generator=g).to(device, torch.bfloat16))
    store = Write(bufs["store"], torch.tensor([1, 2], **i64), torch.randn(2, 64, generator=g).to(device, torch.bfloat16),
                  torch.tensor([True, False], device=device))
    return [win, store], [torch.arange(R, **i64), torch.tensor([1, R - 1], **i64)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("accepted", [0, 1, 3])
def test_a_chunks_writes_are_taken_back_by_their_rows(device, accepted, kernels_on, monkeypatch):
    """A chunk's writes in one application, each index tagged with its row: the take-back restores the indices of
    the rows not kept and no other, with torch's ops and the fused kernels alike (the same bytes)."""
    R, outs = 4, []
    for fused in (False, True):
        monkeypatch.setitem(fused_undo.CONFIG, "fused", fused)
        g = torch.Generator().manual_seed(3)
        bufs = buffers(device, g)
        before = {k: v.clone() for k, v in bufs.items()}
        writes, tags = chunk_writes(bufs, R, device, g)
        undo = Undo()
        undo.apply(writes, tags)
        applied = {k: v.clone() for k, v in bufs.items()}
        undo.take_back(torch.arange(R, device=device) <= accepted)
        outs.append(bufs)
        for r in range(R):  # window slot 3 + r: row r's key where it is kept, the old one where not
            want = applied["win"][3 + r] if r <= accepted else before["win"][3 + r]
            assert torch.equal(bufs["win"][3 + r], want), (fused, r)
        assert torch.equal(bufs["store"][1], applied["store"][1] if accepted >= 1 else before["store"][1])
        assert torch.equal(bufs["store"][2], before["store"][2])  # the open window's write kept nothing
        assert torch.equal(bufs["ring"], before["ring"]) and torch.equal(bufs["f32"], before["f32"])
    assert all(torch.equal(outs[0][k], outs[1][k]) for k in outs[0])


@pytest.mark.parametrize("device", DEVICES)
def test_refused_verify_takes_every_row_back(device, kernels_on):
    g = torch.Generator().manual_seed(9)
    bufs = buffers(device, g)
    before = {k: v.clone() for k, v in bufs.items()}
    undo = Undo()
    for r in range(4):
        undo.apply(row_writes(bufs, r, device, g), r)
    undo.take_back(torch.zeros(4, dtype=torch.bool, device=device))
    assert all(torch.equal(bufs[k], before[k]) for k in bufs)


@pytest.mark.skipif(not kernels.interpreting(), reason="the tiny model's kernels on CPU need Triton's interpreter "
                    "(on CUDA: tests/test_speculative_gpu.py's fused_undo cases)")
def test_verify_steps_with_the_fused_undo_keep_the_plain_stream(kernels_on, monkeypatch):
    """The tiny model through every kernel (the interpreter), its verify steps' writes by the fused Undo."""
    model = dsv4.load("tiny", device="cpu")
    sampling = dsv4.SamplingParams(temperature=1.0, seed=2)
    prompt = [5, 9, 3, 7, 1, 2]
    state, token, plain = model.new_state(32), prompt[-1], []
    model.prefill(state, prompt[:-1])
    for _ in range(7):
        token = model.step(state, token, sampling)
        plain.append(token)
    digest = state.digest()
    state = model.new_state(32)
    model.prefill(state, prompt[:-1])
    drafts = list(plain[:3])
    got = model.verify(state, prompt[-1], drafts, sampling)
    drafts = list(plain[4:7])
    drafts[1] += 1
    got += model.verify(state, got[-1], drafts, sampling)
    got += model.verify(state, got[-1], [], sampling)
    assert list(got) == plain and state.digest() == digest


def test_a_capture_s_tables_are_room_reserved_before_it_and_filled_after_it():
    """An eager step counts its tables' elements (`counting`); a capture of it takes its tables from room reserved
    before it (never the graph's own pool: session 49 call C), records them, and `captured` fills them and hands the
    room to the graph's owner; a failed capture's tables and room do not reach the next."""
    with fused_undo.counting() as count:
        fused_undo._tables.get([(1, 2, 3, 4, 5, 6, 7)] * 2, fused_undo.BACK_FIELDS, torch.device("cpu"))
    assert count == [2 * fused_undo.BACK_FIELDS]
    fused_undo.reserve(torch.device("cpu"), 9)
    tables = fused_undo._tables
    tables.pending += [(0, [(1, 2, 3), (4, 5, 6)]), (6, [(7, 8, 9)])]
    tables.used = 9
    room = fused_undo.captured()
    assert len(room) == 1 and room[0].tolist() == list(range(1, 10))
    assert tables.pending == [] and tables.room is None and tables.used == 0
    fused_undo.reserve(torch.device("cpu"), 3)
    tables.pending.append((0, [(7, 8, 9)]))
    fused_undo.capture_failed()
    assert fused_undo.captured() == [] and tables.room is None


@pytest.mark.slow  # 17 s of CI's interpreter (session 52) while the fused Undo is off by default
@pytest.mark.skipif(not kernels.interpreting(), reason="counts the kernels' launches run in Triton's interpreter")
def test_a_verify_step_takes_its_writes_back_in_one_launch_a_row_and_layer(kernels_on):
    """With CONFIG fused a verify step of R rows makes R launches of the Undo's writes a layer (all of a row's writes
    in one) and one take-back, and none of torch's gathers and index copies (session 49's census of tiny: 213
    launches a row with torch's ops, 97 with these)."""
    from launches import verify_census

    model = dsv4.load("tiny", device="cpu")
    state = model.new_state(32)
    model.prefill(state, [5, 9, 3, 7, 1, 2])
    R = 3
    census = verify_census(model, state, torch.tensor([4, 8, 6]), dsv4.SamplingParams(temperature=1.0, seed=2))
    assert census.ops["triton::_apply_kernel"] == R * model.cfg.num_hidden_layers
    assert census.ops["triton::_back_kernel"] == 1
    assert not [site for (site, op), n in census.sites.items() if site.startswith("dsv4/model/commit.py")]
