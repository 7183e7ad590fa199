"""dsv4.kernels.qgemv_mma: the FP8 GEMVs as m16n8k16 products, the step's rows their columns (DSV4_QGEMV=mma).

On the GPU (Gluon compiles for it only): against the dequantised reference within bf16's rounding of the output
(quantised_cases.close: rtol 2**-7), and bit for bit where the design promises it: every row of a batch of 1, 3, 8, 9
or 19 rows equals that row launched alone (any column, any row group), the fused split sum the second launch's, a
graph's replay the eager launch. Weights the kernel does not take (fp32 scales, scales out of its range) run v3, which
is as batch-invariant. On CPU the family runs v3 (Triton's interpreter does not run Gluon): the choice declines and the
split depends on the weight's shape alone."""

from __future__ import annotations

import pytest
import torch

from dsv4.formats import QWeight
from dsv4.kernels import qgemv, qgemv_mma

from quantised_cases import close, quantised

CUDA = torch.cuda.is_available() and qgemv_mma.gl is not None


def gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not CUDA, reason="needs a GPU (Gluon compiles for it only)")(test))


def test_declines_off_the_gpu_and_splits_follow_the_weight(monkeypatch):
    g = torch.Generator().manual_seed(0)
    w = quantised("fp8", 256, 1024, g)
    assert not qgemv_mma.fits(torch.randn(1, 1024, dtype=torch.bfloat16), w)
    monkeypatch.setattr(qgemv_mma, "CONFIG", {"rt": 1, "warps": 4, "u": 4, "programs": 264})
    assert qgemv_mma.splits(4096, 4096) == 2  # 256 tiles: 2 splits of 2 steps reach 264 programs
    assert qgemv_mma.splits(32768, 1024) == 1  # one step: nothing to split
    assert qgemv_mma.splits(1536, 4096) == 4  # 96 tiles, 4 steps: a step a split
    assert qgemv_mma.splits(1024, 8192) == 8


def _reference(x, w, groups=1):
    wt = w.dequant(torch.float32)
    if groups > 1:
        return torch.einsum("tgi,goi->tgo", x.float().view(x.shape[0], groups, -1),
                            wt.view(groups, w.shape[0] // groups, -1)).flatten(1)
    return x.float() @ wt.T


def _each_row_alone(fn, x, w):
    """Every row of fn(x[:B], w), B = 1, 3, 8, 9, 19, equal to that row alone; a row at another column too."""
    rows = [fn(x[r:r + 1], w) for r in range(19)]
    for B in (1, 3, 8, 9, 19):
        got = fn(x[:B], w)
        for r in range(B):
            assert torch.equal(got[r:r + 1], rows[r]), (B, r)
    assert torch.equal(fn(x[[18, 2, 0, 5]], w)[0:1], rows[18])


@pytest.mark.parametrize("N,K", [(256, 1024), (1536, 4096), (512, 8192)])
@gpu
def test_linear_against_the_reference_and_row_by_row(monkeypatch, N, K):
    monkeypatch.setitem(qgemv.CONFIG, "kernel", "mma")
    g = torch.Generator().manual_seed(N + K)
    w = quantised("fp8", N, K, g).to("cuda")
    x = torch.randn(19, K, generator=g).to("cuda", torch.bfloat16)
    assert qgemv_mma.fits(x, w)
    close(qgemv.linear(x, w), _reference(x, w).to(torch.bfloat16), torch.bfloat16)
    _each_row_alone(qgemv.linear, x, w)
    assert not qgemv.tickets_for(1, x.device).any()


@gpu
def test_slice_grouped_second_launch_and_graph(monkeypatch):
    """A rank's rows starting 64 into a scale block (and 128 columns in); the split sum in a second launch (no
    tickets) with the fused sum's bits; the grouped wo_a row by row; a captured graph's replay."""
    monkeypatch.setitem(qgemv.CONFIG, "kernel", "mma")
    g = torch.Generator().manual_seed(3)
    full = quantised("fp8", 1024 + 128, 4096 + 128, g)
    sliced = QWeight(full.data[64:64 + 1024, 128:].contiguous(), full.scale[:, 1:].contiguous(), "fp8", 64,
                     128).to("cuda")
    x = torch.randn(9, 4096, generator=g).to("cuda", torch.bfloat16)
    assert qgemv_mma.fits(x, sliced) and qgemv_mma.splits(*sliced.shape) > 1
    fused = qgemv.linear(x, sliced)
    close(fused, _reference(x, sliced).to(torch.bfloat16), torch.bfloat16)
    with monkeypatch.context() as m:
        m.setattr(qgemv, "tickets_for", lambda count, device: None)
        assert torch.equal(qgemv.linear(x, sliced), fused)
    groups = 4
    w = quantised("fp8", groups * 256, 1024, g).to("cuda")
    xg = torch.randn(19, groups * 1024, generator=g).to("cuda", torch.bfloat16)
    assert qgemv_mma.fits(xg, w, w.shape[0] // groups)
    close(qgemv.grouped_linear(xg, w, groups), _reference(xg, w, groups).to(torch.bfloat16), torch.bfloat16)
    _each_row_alone(lambda a, b: qgemv.grouped_linear(a, b, groups), xg, w)
    out = torch.empty_like(fused[:1])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        qgemv.linear(x[:1], sliced, out=out)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, fused[:1])


@gpu
def test_what_it_does_not_take_runs_v3(monkeypatch):
    """fp32 scales, and e8m0 scales past its range, take v3: the same bits as the v3 family."""
    g = torch.Generator().manual_seed(5)
    w = quantised("fp8", 256, 1024, g)
    x = torch.randn(3, 1024, generator=g).to("cuda", torch.bfloat16)
    big = QWeight(w.data, (w.scale.view(torch.uint8) * 0 + 140).view(torch.float8_e8m0fnu), "fp8").to("cuda")
    for weight in (QWeight(w.data, w.scale.float(), "fp8").to("cuda"), big):
        assert not qgemv_mma.fits(x, weight)
        monkeypatch.setitem(qgemv.CONFIG, "kernel", "v3")
        v3 = qgemv.linear(x, weight)
        monkeypatch.setitem(qgemv.CONFIG, "kernel", "mma")
        assert torch.equal(qgemv.linear(x, weight), v3)
