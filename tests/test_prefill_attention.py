"""The prefill attention kernel (dsv4.kernels.prefill_attention) against the reference (model.attention._attend).

States are random: ring rows, store rows, the chunk's rows and queries; the masks are the real ones
(step.Step at the chosen position, window W), CSA's picks come from random indexer scores under the
index_topk rule (early positions have invalid picks). Chunks start at 0 and at unaligned positions
with a partly filled or wrapped ring, cross compressed-window closes, and are longer than the window
and than a key tile; heads are not a multiple of the head block. Tolerance, float32: rtol = atol = 1e-5
(the kernel sums in another order, in fp32 throughout). bfloat16 against the float32 reference on the
same bf16 inputs: 2**-7 of the output's largest magnitude (the kernel rounds p to bf16 for p*v and the
output once). Two runs are bit-identical.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dsv4 import kernels
from dsv4.config import CSA, HCA, SLIDING, preset
from dsv4.kernels import prefill_attention as pattn
from dsv4.model.attention import _attend
from dsv4.model.rope import Rope
from dsv4.model.step import Step
from dsv4.syncguard import NoHostSync

pytest.importorskip("triton")

DEVICES = (["cpu"] if kernels.interpreting() else []) + (["cuda"] if torch.cuda.is_available() else [])
CAPACITY = 96


def case(kind, pos, T, heads, head_dim, dtype, device, window=8, topk=8, capacity=CAPACITY, seed=0):
    """(args, extra) for pattn.attention / _attend: a random state of one layer of `kind` at `pos`."""
    cfg = dataclasses.replace(preset("tiny"), head_dim=head_dim, sliding_window=window, index_topk=topk)
    g = torch.Generator().manual_seed(seed * 1000 + pos * 10 + T)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(dtype).to(device)

    step = Step(torch.tensor(pos, device=device), T, Rope(cfg, device), cfg.sliding_window)
    visible, _ = step.sliding()
    cos, sin = step.cos_sin("main" if kind == SLIDING else "compress")
    sink = (torch.randn(heads, generator=g) * 2).to(device)
    args = (rand(T, heads, head_dim) * 3, rand(window, head_dim), rand(T, head_dim), visible, sink, cos, sin)
    if kind == SLIDING:
        return args, {}
    m = cfg.compress_rates[kind]
    rows = capacity // m + 2
    win = step.windows(m, 2 * m if kind == CSA else m, rows)
    comp, new = rand(rows, head_dim), rand(win.wids.shape[0], head_dim)
    if kind == HCA:
        return args, dict(comp=comp, new=new, committed=win.committed, new_visible=win.visible)
    scores = torch.randn(T, rows + new.shape[0], generator=g).to(device)
    scores = scores.masked_fill(~torch.cat([win.committed.expand(T, -1), win.visible], -1), float("-inf"))
    k = min(cfg.index_topk, scores.shape[-1])
    ordered, order = torch.sort(scores, dim=-1, descending=True, stable=True)
    return args, dict(comp=comp, new=new, sel=order[:, :k], valid=ordered[:, :k] > float("-inf"))


def reference(args, extra):
    up = [a.float() if a.is_floating_point() else a for a in args]
    return _attend(*up, **{k: v.float() if v.is_floating_point() else v for k, v in extra.items()})


def check(kind, pos, T, heads, head_dim, dtype, device, **shape):
    args, extra = case(kind, pos, T, heads, head_dim, dtype, device, **shape)
    assert pattn.supported(*args, **extra)
    got = pattn.attention(*args, **extra)
    assert got.dtype == dtype and got.shape == args[0].shape
    ref = reference(args, extra)
    if dtype == torch.float32:
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    else:
        assert float((got.float() - ref).abs().max()) <= 2 ** -7 * float(ref.abs().max())
    return got
