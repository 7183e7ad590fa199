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


def config(window=8, topk=8, base="tiny", **fields):
    return dataclasses.replace(preset(base), sliding_window=window, index_topk=topk, **fields)


def case(kind, pos, T, heads, dtype, device, cfg, capacity=CAPACITY, seed=0):
    """(args, extra) for pattn.attention / _attend: a random state of one layer of `kind` at `pos`."""
    g = torch.Generator().manual_seed(seed * 1000 + pos * 10 + T)
    hd = cfg.head_dim

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(dtype).to(device)

    step = Step(torch.tensor(pos, device=device), T, Rope(cfg, device), cfg.sliding_window)
    visible, _ = step.sliding()
    cos, sin = step.cos_sin("main" if kind == SLIDING else "compress")
    sink = (torch.randn(heads, generator=g) * 2).to(device)
    args = (rand(T, heads, hd) * 3, rand(cfg.sliding_window, hd), rand(T, hd), visible, sink, cos, sin)
    if kind == SLIDING:
        return args, {}
    m = cfg.compress_rates[kind]
    rows = capacity // m + 2
    win = step.windows(m, 2 * m if kind == CSA else m, rows)
    comp, new = rand(rows, hd), rand(win.wids.shape[0], hd)
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


def check(kind, pos, T, heads, dtype, device, cfg, **shape):
    args, extra = case(kind, pos, T, heads, dtype, device, cfg, **shape)
    assert pattn.supported(*args, **extra)
    got = pattn.attention(*args, **extra)
    assert got.dtype == dtype and got.shape == args[0].shape
    ref = reference(args, extra)
    if dtype == torch.float32:
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    else:
        assert float((got.float() - ref).abs().max()) <= 2 ** -7 * float(ref.abs().max())
    return got


@pytest.mark.parametrize("window", [8, 128])
@pytest.mark.parametrize("pos", [0, 1, 5, 127, 128, 300, 1001])
@pytest.mark.parametrize("T", [1, 9, 128, 300])
def test_visible_is_the_window_band(window, pos, T):
    """What the kernel assumes of the model's mask: a query sees chunk row j exactly when t - W < j <= t
    (W = the ring's rows), and no ring row past the chunk's first W - 1 queries."""
    cfg = config(window)
    visible, _ = Step(torch.tensor(pos), T, Rope(cfg, "cpu"), window).sliding()
    t, j = torch.arange(T).unsqueeze(-1), torch.arange(T)
    assert torch.equal(visible[:, window:], (j <= t) & (j > t - window))
    assert not visible[window - 1:, :window].any()


# Window 8: CSA rate 4, HCA rate 16 (tiny). Chunks from 0 and at unaligned positions, the ring partly filled
# (5) or wrapped (21, 37, 60); chunks over several closes; T not a multiple of the key tile or of the window.
POSITIONS = [(SLIDING, 0, 13), (SLIDING, 5, 11), (SLIDING, 21, 17),
             (CSA, 0, 12), (CSA, 3, 10), (CSA, 21, 9), (CSA, 45, 30),
             (HCA, 0, 20), (HCA, 5, 14), (HCA, 37, 23), (HCA, 60, 33)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind,pos,T", POSITIONS)
def test_matches_the_reference(device, kind, pos, T):
    """20 heads of 32: one head block of 32 with 12 masked rows; key tiles (32) wider than the window."""
    check(kind, pos, T, 20, torch.float32, device, config())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind,pos,T", [(SLIDING, 7, 45), (CSA, 13, 37), (HCA, 50, 41)])
def test_tiles_narrower_than_the_window(monkeypatch, device, kind, pos, T):
    """Window 20 over key tiles of 16 (the band spans two or three unaligned tiles), 24 picks, head blocks
    of 16 over 20 heads (the second block partly masked)."""
    monkeypatch.setitem(pattn.CONFIG, "block_n", 16)
    monkeypatch.setitem(pattn.CONFIG, "block_h", 16)
    check(kind, pos, T, 20, torch.float32, device, config(window=20, topk=24))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind,pos,T", [(CSA, 0, 21), (CSA, 45, 30), (HCA, 0, 20), (HCA, 60, 33)])
def test_skip_variants(monkeypatch, device, kind, pos, T):
    """Tiles of picks or store rows none of which the query sees: skipped or scored masked, the same result."""
    monkeypatch.setitem(pattn.CONFIG, "block_n", 16)
    monkeypatch.setitem(pattn.CONFIG, "skip_picks", True)
    monkeypatch.setitem(pattn.CONFIG, "skip_rows", False)
    check(kind, pos, T, 20, torch.float32, device, config(topk=24), capacity=400)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind,pos,T", [(CSA, 45, 30), (HCA, 37, 23), (SLIDING, 21, 17)])
def test_bfloat16(device, kind, pos, T):
    check(kind, pos, T, 16, torch.bfloat16, device, config(head_dim=64, qk_rope_head_dim=16))


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_and_no_host_sync(device):
    args, extra = case(CSA, 21, 19, 20, torch.float32, device, config())
    first = pattn.attention(*args, **extra)
    with NoHostSync():
        second = pattn.attention(*args, **extra)
    assert torch.equal(first, second)


def test_unsupported_shapes():
    """A head_dim not a power of two, a mask that is not [T, W + T]: the model keeps _attend."""
    args, extra = case(HCA, 21, 9, 4, torch.float32, "cpu", config(head_dim=48))
    assert not pattn.supported(*args, **extra)
    args, extra = case(HCA, 21, 9, 4, torch.float32, "cpu", config())
    assert not pattn.supported(args[0], args[1], args[2], args[3][:, 1:], *args[4:], **extra)


class _PrefillKernelOnly:
    """dsv4.model.attention's view of dsv4.kernels: Triton for the prefill attention kernel alone (its
    GPU_CHECKED patched to _MARK), every other op on its torch reference."""
    @staticmethod
    def use_triton(t, gpu_checked=True):
        return gpu_checked is _MARK


_MARK = object()


@pytest.mark.skipif(not kernels.interpreting() and not torch.cuda.is_available(), reason="needs a GPU or the interpreter")
@torch.inference_mode()
def test_model_prefill_with_the_kernel_equals_single_steps(monkeypatch):
    """tiny, fp32: prefill chunks (over the window and both rates, unaligned starts) whose attention cores run
    the kernel, every other op the torch reference, against single decode steps on the reference: logits
    within tests/test_prefill.py's TOL (1e-4 relative), and the kernel ran for every layer of every chunk.
    A chunk's transaction through it reads no device value on the host (check_capturable; on CPU, where the
    rest of the fp32 reference prefill is capturable too)."""
    import dsv4
    from dsv4.model import attention as attention_mod

    device = DEVICES[-1]
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    model = dsv4.load("tiny", device=device, dtype=torch.float32, seed=3)
    stream = torch.randint(2, 512, (60,), generator=torch.Generator().manual_seed(4)).tolist()
    state = model.new_state(64)
    ref = [model.decode(state, t) for t in stream]

    calls, kernel = [], pattn.attention
    monkeypatch.setattr(attention_mod, "kernels", _PrefillKernelOnly)
    monkeypatch.setattr(pattn, "GPU_CHECKED", _MARK)
    monkeypatch.setattr(pattn, "attention", lambda *a, **k: calls.append(a[0].shape[0]) or kernel(*a, **k))
    state, start = model.new_state(64), 0
    for n, chunk in ((23, 23), (30, 15)):  # ends at 23, 53
        logits = model.prefill(state, stream[start:start + n], chunk_size=chunk)
        start += n
        rel = float((logits - ref[start - 1]).abs().max() / ref[start - 1].abs().max())
        assert rel <= 1e-4, f"prefill ending at {start}"
    assert calls == [23] * 5 + [15] * 10
    if device == "cpu":  # on CUDA the fp32 reference's grouped matmul loop reads its group ends (not capturable)
        model.check_capturable(model.new_state(64), stream[:20])  # a prefill chunk through the kernel: no host sync
        assert calls[-5:] == [20] * 5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", [SLIDING, CSA, HCA])
def test_flash_shapes_bf16_on_cuda(kind):
    """Flash's shapes on a rank of 2 (64 heads of 512, rope 64, window 128, 512 picks, HCA rate 128),
    a chunk of 512 at 3000 (the ring full, every pick valid) and one of 500 at 0: the compiled kernel in
    bf16 against the fp32 reference, within 2**-7 of the largest output."""
    cfg = config(window=128, topk=512, base="flash")
    for pos, T in ((3000, 512), (0, 500)):
        check(kind, pos, T, 64, torch.bfloat16, "cuda", cfg, capacity=4096)
