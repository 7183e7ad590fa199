"""dsv4.kernels.qgemv_gl: the v2 family's FP8 GEMV in Gluon (DSV4_QGEMV_GL=1).

On the GPU (Gluon compiles for it only): against the dequantised reference within bf16's rounding of the output
(quantised_cases.close: rtol 2**-7), and bit for bit where the design promises it: each row alone equals that row in
a batch of 3 or 8 (and 8 rows in one program equal a program a row), the fused split sum equals the second launch's,
a captured graph's replay equals the eager launch. On CPU: the choice declines (Triton's interpreter does not run
Gluon) and the split depends on the weight's shape alone."""

from __future__ import annotations

import pytest
import torch

from dsv4.formats import QWeight
from dsv4.kernels import qgemv, qgemv_gl

from quantised_cases import close, quantised

CUDA = torch.cuda.is_available() and qgemv_gl.gl is not None


def gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not CUDA, reason="needs a GPU (Gluon compiles for it only)")(test))


def test_declines_off_the_gpu(monkeypatch):
    monkeypatch.setitem(qgemv_gl.CONFIG, "on", True)
    g = torch.Generator().manual_seed(0)
    w = quantised("fp8", 256, 1024, g)
    assert not qgemv_gl.chosen(torch.randn(1, 1024, dtype=torch.bfloat16), w, 1)


def test_splits_follow_the_weight(monkeypatch):
    """Whole steps a split, doubled while the launch is short of programs or a split too long; never more splits
    than steps."""
    monkeypatch.setitem(qgemv_gl.CONFIG, "rows_per_thread", 2)
    monkeypatch.setitem(qgemv_gl.CONFIG, "num_warps", 4)
    monkeypatch.setitem(qgemv_gl.CONFIG, "programs", 528)
    monkeypatch.setitem(qgemv_gl.CONFIG, "max_steps", 4)
    assert qgemv_gl.splits(1024, 4096) == 8  # 128 blocks: 8 splits of one step reach 1,024 programs
    assert qgemv_gl.splits(4096, 8192) == 4  # 512 blocks x 2 would do, but 16 steps make at most 4 a split
    assert qgemv_gl.splits(32768, 1024) == 1  # 4,096 blocks
    assert qgemv_gl.splits(64, 512) == 1  # one step: nothing to split
    for N, K in ((1024, 4096), (4096, 8192), (8192, 1024), (512, 2048)):
        s = qgemv_gl.splits(N, K)
        assert (K // qgemv_gl.STEP) % s == 0 and K // qgemv_gl.STEP // s <= 4


def _on(monkeypatch, rn=2, warps=4):
    monkeypatch.setitem(qgemv_gl.CONFIG, "on", True)
    monkeypatch.setitem(qgemv_gl.CONFIG, "rows_per_thread", rn)
    monkeypatch.setitem(qgemv_gl.CONFIG, "num_warps", warps)


def _reference(x, w, groups=1):
    wt = w.dequant(torch.float32)
    if groups > 1:
        return torch.einsum("tgi,goi->tgo", x.float().view(x.shape[0], groups, -1),
                            wt.view(groups, w.shape[0] // groups, -1)).flatten(1)
    return x.float() @ wt.T


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("N,K,rn,warps", [(256, 512, 2, 4), (512, 2048, 4, 4), (1024, 4096, 2, 8), (256, 8192, 2, 4)])
@gpu
def test_linear_against_the_reference_and_row_by_row(monkeypatch, dtype, N, K, rn, warps):
    _on(monkeypatch, rn, warps)
    g = torch.Generator().manual_seed(N + K)
    w = quantised("fp8", N, K, g).to("cuda")
    x = (torch.randn(8, K, generator=g)).to("cuda", dtype)
    assert qgemv_gl.chosen(x, w, 8)
    batched = qgemv.linear(x, w)
    close(batched, _reference(x, w).to(dtype), dtype)
    for rows in (1, 3):
        for r0 in range(0, 8 - rows + 1, rows):
            assert torch.equal(qgemv.linear(x[r0:r0 + rows], w), batched[r0:r0 + rows]), (rows, r0)
    monkeypatch.setitem(qgemv.CONFIG, "v2_rows", 1)  # a program a row
    assert torch.equal(qgemv.linear(x, w), batched)


@gpu
def test_slice_grouped_and_the_second_launch(monkeypatch):
    """A rank's row slice starting 64 rows into a scale block (and 128 columns in), the grouped wo_a, and the split
    sum in a second launch (no tickets) with the fused sum's bits."""
    _on(monkeypatch)
    g = torch.Generator().manual_seed(3)
    full = quantised("fp8", 1024 + 128, 2048 + 128, g)
    sliced = QWeight(full.data[64:64 + 1024, 128:].contiguous(), full.scale[:, 1:].contiguous(), "fp8", 64,
                     128).to("cuda")
    x = torch.randn(3, 2048, generator=g).to("cuda", torch.bfloat16)
    assert qgemv_gl.chosen(x, sliced, 3) and qgemv_gl.splits(*sliced.shape) > 1
    fused = qgemv.linear(x, sliced)
    close(fused, _reference(x, sliced).to(torch.bfloat16), torch.bfloat16)
    monkeypatch.setattr(qgemv, "tickets_for", lambda count, device: None)
    assert torch.equal(qgemv.linear(x, sliced), fused)
    monkeypatch.undo()
    _on(monkeypatch)
    groups = 4
    w = quantised("fp8", groups * 256, 1024, g).to("cuda")
    x = torch.randn(2, groups * 1024, generator=g).to("cuda", torch.bfloat16)
    assert qgemv_gl.chosen(x, w, 2, w.shape[0] // groups)
    got = qgemv.grouped_linear(x, w, groups)
    close(got, _reference(x, w, groups).to(torch.bfloat16), torch.bfloat16)
    assert torch.equal(qgemv.grouped_linear(x[1:], w, groups), got[1:])


@gpu
def test_graph_replay_equals_eager(monkeypatch):
    _on(monkeypatch)
    g = torch.Generator().manual_seed(4)
    w = quantised("fp8", 1024, 4096, g).to("cuda")
    x = torch.randn(1, 4096, generator=g).to("cuda", torch.bfloat16)
    eager = qgemv.linear(x, w)  # the eager launch makes the split tickets
    out = torch.empty_like(eager)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        qgemv.linear(x, w, out=out)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
