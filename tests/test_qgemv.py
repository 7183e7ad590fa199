"""qgemv's v2 kernel (split-K, FP4 words) and the two-launch MoE decode (dsv4.kernels.moe) against the
torch reference (dequantise + matmul), on fresh random weights.

On CPU the kernels run through Triton's interpreter (conftest), on a GPU compiled. Tolerances: fp32
outputs within rtol = atol = 1e-5 (sums in another order); bf16 outputs within one bf16 rounding step
(rtol 2**-7, atol 1e-5: the sums may differ in their last fp32 bits and so round to the neighbouring
bf16); an expert's bf16 chain of roundings within 2**-6 of the largest output (close_chain).
Determinism: two runs are bit-identical.
"""

from __future__ import annotations

import pytest
import torch

from dsv4 import kernels
from dsv4.formats import quantize_fp4, quantize_fp8
from dsv4.config import preset
from dsv4.kernels import moe as fused_moe
from dsv4.kernels import qgemv
from dsv4.model import linear as linear_mod
from dsv4.model import moe as moe_mod
from dsv4.formats import QWeight

pytest.importorskip("triton")

DEVICES = (["cpu"] if kernels.interpreting() else []) + (["cuda"] if torch.cuda.is_available() else [])


def per_device(params, slow_on_cpu=()):
    """(device, *param) cases; those in `slow_on_cpu` join the slow set on CPU only (the interpreter's
    minutes; CI keeps one case of each test), every case runs on CUDA."""
    return [pytest.param(d, *p, marks=[pytest.mark.slow] if d == "cpu" and p in slow_on_cpu else [])
            for d in DEVICES for p in params]


def close(a, b, dtype):
    if dtype == torch.float32:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(a.float(), b.float(), rtol=2 ** -7, atol=1e-5)


def close_chain(a, b, dtype):
    """An expert is a chain of bf16 roundings (gate/up, silu, product, down, weighting), where an
    element one bf16 step apart early moves later sums by several steps: bf16 outputs agree within
    2**-6 of the largest output (each is within ~2**-7 of it from the exact float64 result)."""
    if dtype == torch.float32:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(a.float(), b.float(), rtol=0, atol=2 ** -6 * float(b.float().abs().max()))


def both(monkeypatch, fn):
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    ref = fn()
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    return ref, fn()


def quantised(fmt: str, rows: int, cols: int, g, experts: int = 0) -> QWeight:
    q = quantize_fp8 if fmt == "fp8" else quantize_fp4
    parts = [q(torch.randn(rows, cols, generator=g) * 0.05) for _ in range(max(experts, 1))]
    data, scale = (torch.stack(p) for p in zip(*parts)) if experts else parts[0]
    return QWeight(data, scale, fmt)


# ---- qgemv v2 ------------------------------------------------------------------------------------

V2 = {"kernel": "v2", "v2_block_n": 8, "v2_block_k_fp8": 256, "v2_block_k_fp4": 64}


@pytest.fixture(params=[0, 1, 3], ids=["split_auto", "split_1", "split_3"])
def v2(request, monkeypatch):
    """v2 with small tiles; split-K automatic (here: as many splits as K tiles), off, or 3."""
    for key, value in {**V2, "v2_split_k": request.param}.items():
        monkeypatch.setitem(qgemv.CONFIG, key, value)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,T,N,K,dtype", [("fp8", 1, 300, 640, torch.float32), ("fp8", 3, 256, 200, torch.bfloat16),
                                             ("fp4", 1, 96, 256, torch.float32), ("fp4", 2, 40, 160, torch.bfloat16)])
def test_v2_linear(monkeypatch, v2, device, fmt, T, N, K, dtype):
    g = torch.Generator().manual_seed(N + K)
    w = quantised(fmt, N, K, g).to(device)
    x = torch.randn(T, K, generator=g).to(dtype).to(device)
    assert qgemv.supported(x, w, T)
    ref, got = both(monkeypatch, lambda: linear_mod.linear(x, w))
    assert got.dtype == dtype and got.shape == (T, N)
    close(got, ref, dtype)
    assert torch.equal(got, linear_mod.linear(x, w))  # deterministic, split or not


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,K,split_k", [("fp8", 256, 1), ("fp8", 640, 1), ("fp8", 1024, 2), ("fp4", 64, 1),
                                           ("fp4", 160, 1), ("fp4", 256, 2)],
                         ids=["fp8-one_tile", "fp8-masked_tail", "fp8-split", "fp4-one_tile", "fp4-masked_tail",
                              "fp4-split"])
def test_v2_early_tile_keeps_the_bits(monkeypatch, device, fmt, K, split_k):
    """A stored weight's launch (EARLY: the first tile loaded before the loop, then DSV4_PDL's wait) equals the loop
    main runs, which the routed experts keep (expert_linear on a stack of that one weight): one K tile, tiles whose
    last is masked, each split's chunk of two tiles; 1 and 3 rows, bf16 and fp32 x."""
    for key, value in {**V2, "v2_split_k": split_k}.items():
        monkeypatch.setitem(qgemv.CONFIG, key, value)
    g = torch.Generator().manual_seed(K)
    w = quantised(fmt, 24, K, g).to(device)
    stack = QWeight(w.data[None], w.scale[None], fmt)
    for rows, dtype in ((1, torch.bfloat16), (3, torch.float32)):
        x = torch.randn(rows, K, generator=g).to(dtype).to(device)
        early = qgemv.linear(x, w)
        loop = qgemv.expert_linear(x, stack, torch.zeros(rows, dtype=torch.int64, device=device), 1)
        assert torch.equal(early, loop), (rows, dtype)


def test_v2_split_choice(monkeypatch):
    """Automatic split-K doubles while the launch is short of programs, never past the K tiles."""
    monkeypatch.setitem(qgemv.CONFIG, "v2_split_k", 0)
    monkeypatch.setitem(qgemv.CONFIG, "v2_programs", 264)
    assert qgemv.splits_for(64, 8) == 8  # wq_a at BLOCK_N 16: 64 programs, 8 tiles of 512
    assert qgemv.splits_for(64, 2) == 2
    assert qgemv.splits_for(1024, 2) == 1  # wq_b: enough programs
    monkeypatch.setitem(qgemv.CONFIG, "v2_split_k", 4)
    assert qgemv.splits_for(1024, 8) == 4 and qgemv.splits_for(1024, 2) == 2


@pytest.mark.parametrize("device,fmt,N,K", per_device(
    [("fp8", 12, 1024), ("fp8", 9, 1280), ("fp4", 12, 256), ("fp4", 8, 320)],
    slow_on_cpu=[("fp8", 9, 1280), ("fp4", 12, 256)]))
def test_v2_fused_sum_bit_identical(monkeypatch, device, fmt, N, K):
    """The splits summed by the last program of each row block (v2_fused_sum) give the same bits as the
    second launch: rows 1..MAX_ROWS, splits 1/2/4/8 (each row count with two of them), FP8 (a row slice
    inside a scale block) and FP4 stacked experts, bf16 and fp32 outputs, K a whole number of splits
    or not. The tickets are back at 0 after each launch."""
    for key, value in {**V2, "v2_block_k_fp8": 128, "v2_block_k_fp4": 32}.items():
        monkeypatch.setitem(qgemv.CONFIG, key, value)
    g = torch.Generator().manual_seed(N * K)
    if fmt == "fp8":
        full = quantised("fp8", N + 64, K, g)
        w = QWeight(full.data[64:].contiguous(), full.scale.contiguous(), "fp8", 64, 0).to(device)
    else:
        w = quantised("fp4", N, K, g, experts=3).to(device)
    for rows in range(1, qgemv.MAX_ROWS + 1):
        dtype = torch.bfloat16 if rows % 2 else torch.float32
        x = torch.randn(rows, K, generator=g).to(dtype).to(device)
        ids = torch.randint(0, 3, (rows,), generator=g).to(device)
        for splits in ((2, 8) if rows % 2 else (1, 4)):
            monkeypatch.setitem(qgemv.CONFIG, "v2_split_k", splits)
            out = {}
            for fused in (False, True):
                monkeypatch.setitem(qgemv.CONFIG, "v2_fused_sum", fused)
                out[fused] = qgemv.linear(x, w) if fmt == "fp8" else qgemv.expert_linear(x, w, ids, 1)
            assert torch.equal(out[True], out[False]), (rows, splits)
            if splits > 1:
                assert not qgemv.tickets_for(1, x.device).any()


@pytest.mark.parametrize("device,fmt,splits", per_device(
    [("fp8", 1), ("fp8", 3), ("fp4", 1), ("fp4", 3)], slow_on_cpu=[("fp8", 1), ("fp4", 3)]))
def test_v2_rows_each_row_alone(monkeypatch, device, fmt, splits):
    """v2_rows 8 (a program reads each weight tile once for up to 8 rows): every row of B = 1, 3, 8, 11 rows (a
    group, one with a repeated row, a full one, two groups) has the bits of that row launched alone one row per
    program (v2_rows 1), bit for bit: FP8 (a row slice starting inside a scale block; and the grouped wo_a) and
    FP4, N not a whole number of row blocks, K not a whole number of tiles, split-K off or 3 with the splits
    summed in the launch (tickets back at 0) or in a second one; fp32 outputs (and bf16 ones)."""
    for key, value in {**V2, "v2_split_k": splits}.items():
        monkeypatch.setitem(qgemv.CONFIG, key, value)
    g = torch.Generator().manual_seed(splits)
    if fmt == "fp8":
        full = quantised("fp8", 84, 384, g)
        cases = [(QWeight(full.data[64:].contiguous(), full.scale.contiguous(), "fp8", 64, 0), qgemv.linear, 384,
                  torch.float32),
                 (quantised("fp8", 2 * 16, 256, g), lambda x, w: qgemv.grouped_linear(x, w, 2), 512, torch.bfloat16)]
    else:
        cases = [(quantised("fp4", 20, 160, g), qgemv.linear, 160, torch.float32)]
    for w, fn, K, dtype in cases:  # fp32 outputs show every bit of the sums
        w = w.to(device)
        x = torch.randn(11, K, generator=g).to(dtype).to(device)
        monkeypatch.setitem(qgemv.CONFIG, "v2_rows", 1)
        alone = [fn(x[r:r + 1], w) for r in range(11)]
        monkeypatch.setitem(qgemv.CONFIG, "v2_rows", 8)
        for B in (1, 3, 8, 11):
            for fused in ((False, True) if splits > 1 else (True,)):
                monkeypatch.setitem(qgemv.CONFIG, "v2_fused_sum", fused)
                got = fn(x[:B], w)
                for r in range(B):
                    assert torch.equal(got[r:r + 1], alone[r]), (B, fused, r)
                assert not qgemv.tickets_for(1, x.device).any()


def test_v2_rows_per_program():
    """All rows of a launch up to the cap, as a power of two."""
    assert [qgemv.rows_per_program(rows, 8) for rows in (1, 2, 3, 5, 8, 11, 32)] == [1, 2, 4, 8, 8, 8, 8]
    assert qgemv.rows_per_program(3, 1) == 1 and qgemv.rows_per_program(16, 16) == 16


@pytest.mark.slow  # ~3 min in the interpreter; the row tests above run in CI
def test_quantised_tiny_batched_equals_solo_with_rows_per_program(monkeypatch, tmp_path):
    """Through the model: the FP8 tiny checkpoint under DSV4_KERNELS=triton, where a batched step's 3 rows share
    each FP8 linear's programs (v2_rows; a solo step runs one row per program): each row's tokens and committed
    bytes are its sequence's solo ones, step by step."""
    import dsv4
    from dsv4 import SamplingParams
    from dsv4.checkpoint.synth import synth

    monkeypatch.setenv("DSV4_KERNELS", "triton")
    model = dsv4.load(synth(preset("tiny"), tmp_path / "tiny", seed=3, quant="fp8"), device=DEVICES[0],
                      tokenizer="stand-in")
    launched = []
    real = qgemv._launch2
    monkeypatch.setattr(qgemv, "_launch2", lambda x, w, y, rows, experts, *a: launched.append(
        (rows, experts is None)) or real(x, w, y, rows, experts, *a))
    prompts, samplings = [[5, 6, 7], [9, 10, 11, 12, 13, 14], [3, 4]], [SamplingParams(temperature=t, seed=i)
                                                                        for i, t in enumerate([1.0, 0.0, 1.3])]

    def prefilled(i):
        state = model.new_state(32)
        model.prefill(state, prompts[i][:-1])
        return state

    solos = []
    for i in range(3):
        state, token, out = prefilled(i), prompts[i][-1], []
        for _ in range(2):
            token = model.step(state, token, samplings[i])
            out.append((token, state.digest()))
        solos.append(out)
    rows = [2, 0, 1]
    states, tokens = [prefilled(i) for i in rows], [prompts[i][-1] for i in rows]
    launched.clear()
    for step in range(2):
        tokens = list(model.step_batch(states, tokens, [samplings[i] for i in rows]))
        for b, i in enumerate(rows):
            assert (tokens[b], states[b].digest()) == solos[i][step], f"sequence {i}, step {step}"
    assert (3, True) in launched  # the FP8 linears took the batch's rows in one launch


def test_v2_fused_sum_tickets(monkeypatch):
    """The tickets are one buffer per device, made outside a capture; a launch needing more (or a capture
    before the buffer exists) sums in a second launch instead."""
    monkeypatch.setattr(qgemv, "_tickets", {})
    cpu = torch.device("cpu")
    buf = qgemv.tickets_for(10, cpu)
    assert buf is not None and buf.shape == (qgemv.TICKETS,) and buf.dtype == torch.int32 and not buf.any()
    assert qgemv.tickets_for(qgemv.TICKETS, cpu) is buf
    assert qgemv.tickets_for(qgemv.TICKETS + 1, cpu) is None


@pytest.mark.parametrize("device", DEVICES)
def test_v2_slices_grouped_and_experts(monkeypatch, device):
    """A row slice starting inside a scale block, float32 scales, the grouped wo_a and stacked experts."""
    for key, value in {**V2, "v2_split_k": 2}.items():
        monkeypatch.setitem(qgemv.CONFIG, key, value)
    g = torch.Generator().manual_seed(5)
    full = quantised("fp8", 512, 512, g)
    sliced = QWeight(full.data[64:320, 128:].contiguous(), full.scale[0:3, 1:].contiguous(), "fp8", 64, 128)
    for w in (sliced, QWeight(full.data, full.scale.float(), "fp8")):
        w = w.to(device)
        x = torch.randn(1, w.shape[1], generator=g).to(device)
        ref, got = both(monkeypatch, lambda: linear_mod.linear(x, w))
        close(got, ref, torch.float32)
    groups = 4
    w = quantised("fp8", groups * 64, 384, g).to(device)
    x = torch.randn(2, groups * 384, generator=g).to(device)
    ref, got = both(monkeypatch, lambda: linear_mod.grouped_linear(x, w, groups))
    close(got, ref, torch.float32)
    for fmt in ("fp4", "fp8"):
        stack = quantised(fmt, 64, 256, g, experts=5).to(device)
        x = torch.randn(2, 256, generator=g).to(device)
        ids = torch.tensor([0, 4, 3, 2, 4, 1], device=device)
        got = qgemv.expert_linear(x, stack, ids, 3)
        ref = torch.einsum("rnk,rk->rn", stack.dequant(torch.float32)[ids], x.repeat_interleave(3, dim=0))
        close(got, ref, torch.float32)


# ---- qgemv v3 (tensor-core tiles of 16 rows) -------------------------------------------------------

V3 = {"kernel": "v3", "v3_block_n": 16, "v3_block_k_fp8": 256, "v3_block_k_fp4": 64}


def v3_cases(fmt, g):
    """(weight, fn, K, dtype): FP8 rows starting inside a scale block (fp32 x: every bit of the sums shows) and the
    grouped wo_a (bf16 x); FP4 (bf16 x). N not a whole number of row blocks, K not a whole number of tiles."""
    if fmt == "fp8":
        full = quantised("fp8", 84, 384, g)
        return [(QWeight(full.data[64:].contiguous(), full.scale.contiguous(), "fp8", 64, 0), qgemv.linear, 384,
                 torch.float32),
                (quantised("fp8", 2 * 16, 256, g), lambda x, w: qgemv.grouped_linear(x, w, 2), 512, torch.bfloat16)]
    return [(quantised("fp4", 20, 160, g), qgemv.linear, 160, torch.bfloat16)]


@pytest.mark.parametrize("device,fmt,splits", per_device(
    [("fp8", 1), ("fp8", 3), ("fp4", 1), ("fp4", 3)], slow_on_cpu=[("fp8", 1), ("fp4", 1)]))
def test_v3_rows_each_row_alone(monkeypatch, device, fmt, splits):
    """v3: every row of B = 1, 3, 16, 19 rows (one row tile with padding, a full one, two tiles) has the bits of
    that row launched alone (padded to a tile of 16), bit for bit, split-K off or 3 with the splits summed in the
    launch (tickets back at 0) or in a second one; a row in another position of another batch too."""
    for key, value in {**V3, "v2_split_k": splits}.items():
        monkeypatch.setitem(qgemv.CONFIG, key, value)
    g = torch.Generator().manual_seed(10 + splits)
    for w, fn, K, dtype in v3_cases(fmt, g):
        w = w.to(device)
        x = torch.randn(19, K, generator=g).to(dtype).to(device)
        alone = [fn(x[r:r + 1], w) for r in range(19)]
        for B in (1, 3, 16, 19):
            for fused in ((False, True) if splits > 1 else (True,)):
                monkeypatch.setitem(qgemv.CONFIG, "v2_fused_sum", fused)
                got = fn(x[:B], w)
                for r in range(B):
                    assert torch.equal(got[r:r + 1], alone[r]), (B, fused, r)
                assert not qgemv.tickets_for(1, x.device).any()
        assert torch.equal(fn(x[[17, 2, 5]], w)[0:1], alone[17])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,T,N,K,dtype", [("fp8", 3, 300, 640, torch.float32), ("fp8", 17, 256, 200, torch.bfloat16),
                                             ("fp4", 2, 96, 256, torch.float32), ("fp4", 5, 40, 160, torch.bfloat16)])
def test_v3_linear(monkeypatch, device, fmt, T, N, K, dtype):
    """v3 against the reference (dequantise + matmul) within v2's tolerance (close), split-K automatic; deterministic.
    Under rows_alone (a decode step) a launch takes any number of rows (17: two row tiles)."""
    from dsv4.model.rows import rows_alone

    for key, value in {**V3, "v2_split_k": 0}.items():
        monkeypatch.setitem(qgemv.CONFIG, key, value)
    g = torch.Generator().manual_seed(N + K + 1)
    w = quantised(fmt, N, K, g).to(device)
    x = torch.randn(T, K, generator=g).to(dtype).to(device)
    assert qgemv.supported(x, w, 1)
    launched = []
    real = qgemv._launch3
    monkeypatch.setattr(qgemv, "_launch3", lambda x, *a: launched.append(x.shape[0]) or real(x, *a))
    with rows_alone():
        ref, got = both(monkeypatch, lambda: linear_mod.linear(x, w))
    assert launched == [T] and got.dtype == dtype and got.shape == (T, N)
    close(got, ref, dtype)
    assert torch.equal(got, qgemv.linear(x, w))


@pytest.mark.parametrize("device", DEVICES)
def test_v3_slices_grouped_and_experts(monkeypatch, device):
    """v3 on a slice (rows and columns inside the weight, fp32 scales) and the grouped wo_a against the reference;
    the routed experts under v3 take v2 (each row its own weight) and give its bits."""
    for key, value in {**V3, "v2_split_k": 2}.items():
        monkeypatch.setitem(qgemv.CONFIG, key, value)
    g = torch.Generator().manual_seed(6)
    full = quantised("fp8", 512, 512, g)
    sliced = QWeight(full.data[64:320, 128:].contiguous(), full.scale[0:3, 1:].float().contiguous(), "fp8", 64, 128)
    x = torch.randn(2, 384, generator=g).to(device)
    ref, got = both(monkeypatch, lambda: linear_mod.linear(x, sliced.to(device)))
    close(got, ref, torch.float32)
    w = quantised("fp8", 4 * 32, 256, g).to(device)
    x = torch.randn(3, 4 * 256, generator=g).to(torch.bfloat16).to(device)
    ref, got = both(monkeypatch, lambda: linear_mod.grouped_linear(x, w, 4))
    close(got, ref, torch.bfloat16)
    stack = quantised("fp4", 64, 256, g, experts=3).to(device)
    x = torch.randn(2, 256, generator=g).to(device)
    ids = torch.tensor([0, 2, 1, 2], device=device)
    v3 = qgemv.expert_linear(x, stack, ids, 2)
    monkeypatch.setitem(qgemv.CONFIG, "kernel", "v2")
    assert torch.equal(v3, qgemv.expert_linear(x, stack, ids, 2))

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,K,split_k", [("fp8", 256, 1), ("fp8", 200, 1), ("fp8", 640, 1), ("fp8", 1024, 2),
                                           ("fp4", 64, 1), ("fp4", 160, 1), ("fp4", 256, 2)],
                         ids=["fp8-one_tile", "fp8-one_masked_tile", "fp8-masked_tail", "fp8-split", "fp4-one_tile",
                              "fp4-masked_tail", "fp4-split"])
def test_v3_early_tile_keeps_the_bits(monkeypatch, device, fmt, K, split_k):
    """v3's first K tile loaded before the loop (and before DSV4_PDL's wait) gives the bits of main's loop
    (tests/v3_main.py): one K tile (whole or masked), tiles whose last is masked, each split's chunk of two tiles;
    N not a whole number of blocks; 1, 16 and 17 rows (one row tile padded, one full, two); bf16 and fp32 x."""
    from v3_main import v3_main_launches

    for key, value in {**V3, "v2_split_k": split_k}.items():
        monkeypatch.setitem(qgemv.CONFIG, key, value)
    g = torch.Generator().manual_seed(K + 3)
    w = quantised(fmt, 20, K, g).to(device)
    for rows, dtype in ((1, torch.bfloat16), (16, torch.float32), (17, torch.bfloat16)):
        x = torch.randn(rows, K, generator=g).to(dtype).to(device)
        early = qgemv.linear(x, w)
        with v3_main_launches():
            loop = qgemv.linear(x, w)
        assert torch.equal(early, loop), (rows, dtype)


# ---- the MoE decode in two launches ---------------------------------------------------------------

def expert_stacks(fmt: str, n: int, D: int, I: int, g) -> dict:
    return {"w1": quantised(fmt, I, D, g, experts=n), "w3": quantised(fmt, I, D, g, experts=n),
            "w2": quantised(fmt, D, I, g, experts=n)}


def poisoned(stacks: dict, experts: list[int]) -> dict:
    """The same stacks with the given experts' weights unreadable: scales 0xFF (NaN in e8m0, inf in the
    kernels), FP8 data NaN (on a GPU; the interpreter converts it to a number): any read of them
    reaches the output as NaN or inf."""
    out = {}
    for name, w in stacks.items():
        data, scale = w.data.clone(), w.scale.clone()
        for e in experts:
            scale[e].view(torch.uint8).fill_(0xFF)
            if w.fmt == "fp8":
                data[e].view(torch.uint8).fill_(0x7F)
        out[name] = QWeight(data, scale, w.fmt)
    return out


def route_case(device):
    """Rank 1 of 2 over 32 experts (ids 16..31 local, stack slots 0..15): token 0 picks three local experts
    (slots 1, 2, 4) and three remote ones, token 1 one local (slot 5) and five remote."""
    ids = torch.tensor([[1, 2, 5, 17, 18, 20], [0, 3, 4, 6, 7, 21]], device=device)
    weights = torch.tensor([[0.3, 0.2, 0.1, 0.15, 0.05, 0.2], [0.1, 0.1, 0.2, 0.2, 0.3, 0.1]], device=device)
    return ids, weights, 16


def routed_case(fmt: str, D: int, I: int, dtype, device, seed: int):
    """(stacks, x [2, D], shared [2, D], ids, weights, first): route_case's two tokens over 16 random experts."""
    g = torch.Generator().manual_seed(seed)
    stacks = {k: v.to(device) for k, v in expert_stacks(fmt, 16, D, I, g).items()}
    x = torch.randn(2, D, generator=g).to(dtype).to(device)
    shared = torch.randn(2, D, generator=g).to(dtype).to(device)
    ids, weights, first = route_case(device)
    return stacks, x, shared, ids, weights.to(dtype), first


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,T,dtype", [("fp4", 2, torch.float32), ("fp4", 1, torch.bfloat16),
                                         ("fp8", 2, torch.bfloat16)])
def test_moe_decode_against_reference(monkeypatch, device, fmt, T, dtype):
    """moe.routed's decode branch: the two kernels against gathering, dequantising and matmuls. The swiglu
    limit is low enough that both clamps bite."""
    g = torch.Generator().manual_seed(3)
    D, I = 128, 64 if fmt == "fp4" else 128
    stacks = {k: v.to(device) for k, v in expert_stacks(fmt, 16, D, I, g).items()}
    x = torch.randn(T, D, generator=g).to(dtype).to(device)
    ids, weights, first = route_case(device)
    ids, weights = ids[:T], weights[:T].to(dtype)
    cfg = preset("tiny")
    cfg.swiglu_limit = 0.3
    assert fused_moe.supported(x, [stacks[k] for k in ("w1", "w3", "w2")])
    ref, got = both(monkeypatch, lambda: moe_mod.routed(x, ids, weights, stacks, first, cfg))
    assert got.dtype == dtype and got.shape == (T, D)
    close_chain(got, ref, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,dtype", [("fp4", torch.bfloat16), ("fp8", torch.float32)])
def test_moe_shared_add_in_kernel(monkeypatch, device, fmt, dtype):
    """CONFIG shared_add: the shared expert's output added in kernel 2's store has the bits of the torch add after
    it (the routed sum rounded, plus shared, rounded once), for a token with local experts and one whose picks
    are nearly all remote."""
    stacks, x, shared, ids, weights, first = routed_case(fmt, 128, 64 if fmt == "fp4" else 128, dtype, device, 11)
    cfg = preset("tiny")
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    moe_configured(monkeypatch, shared_add=False)
    apart = moe_mod.routed(x, ids, weights, stacks, first, cfg, shared)
    assert torch.equal(apart, moe_mod.routed(x, ids, weights, stacks, first, cfg) + shared)
    moe_configured(monkeypatch, shared_add=True)
    assert torch.equal(moe_mod.routed(x, ids, weights, stacks, first, cfg, shared), apart)


MOE_SMALL = {"block_k_fp4": 32, "block_k_fp8": 128, "gate_up_block_n": 16, "down_block_n": 32, "shared_block_n": 8}


def moe_configured(monkeypatch, **overrides):
    for key, value in {**MOE_SMALL, **overrides}.items():
        monkeypatch.setitem(fused_moe.CONFIG, key, value)


@pytest.mark.parametrize("device,fmt,dtype", per_device(
    [("fp4", torch.bfloat16), ("fp8", torch.float32)], slow_on_cpu=[("fp8", torch.float32)]))
def test_moe_gate_up_variants(monkeypatch, device, fmt, dtype):
    """Kernel 1's options: compact rows give the same bits as the plain grid; split-K (2 and 4 splits, K
    of 4 K tiles) gives the same bits with the sum fused or in a second launch, whether compacted or not,
    and agrees with the reference within close_chain; tickets back at 0. Two tokens, rank 1 of 2. (Triton's
    interpreter runs the programs one after another: the GPU run checks the race for the last ticket.)"""
    g = torch.Generator().manual_seed(7)
    D, I = 128 if fmt == "fp4" else 512, 32 if fmt == "fp4" else 128
    stacks = {k: v.to(device) for k, v in expert_stacks(fmt, 16, D, I, g).items()}
    x = torch.randn(2, D, generator=g).to(dtype).to(device)
    ids, weights, first = route_case(device)
    weights = weights.to(dtype)
    cfg = preset("tiny")
    cfg.swiglu_limit = 0.3
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    ref = moe_mod.routed(x, ids, weights, stacks, first, cfg)
    monkeypatch.setenv("DSV4_KERNELS", "triton")

    def run(**overrides):
        moe_configured(monkeypatch, **overrides)
        return moe_mod.routed(x, ids, weights, stacks, first, cfg)

    plain = run(gate_up_split_k=1, compact=False)
    assert torch.equal(run(gate_up_split_k=1, compact=True), plain)
    for splits in (2, 4):
        split = run(gate_up_split_k=splits, compact=False, fused_sum=True)
        close_chain(split, ref, dtype)
        assert not tickets_any(device)
        for compact, fused in ((False, False), (True, True), (True, False)):
            assert torch.equal(run(gate_up_split_k=splits, compact=compact, fused_sum=fused), split), (splits, compact)


@pytest.mark.parametrize("device,fmt,dtype", per_device(
    [("fp4", torch.bfloat16), ("fp8", torch.float32)], slow_on_cpu=[("fp8", torch.float32)]))
def test_moe_paired_and_split_down_keep_the_bits(monkeypatch, device, fmt, dtype):
    """CONFIG gate_up_paired (FP4 gate and up in one loop) and down_split_experts (kernel 2 a program per
    (row block, token, expert), the terms summed in routing order by the last ticket or a second launch) give
    the plain kernels' bits: with and without the shared add, with split-K, for a token whose experts are
    mostly local and one whose are mostly remote; tickets back at 0. Rows alone equal the batch. (In fp32 the
    plain kernel 2 keeps running: its multiply-add is fused, which a sum of stored terms cannot repeat.)"""
    stacks, x, shared, ids, weights, first = routed_case(fmt, 128 if fmt == "fp4" else 512, 64 if fmt == "fp4" else 128,
                                                         dtype, device, 12)
    cfg = preset("tiny")
    cfg.swiglu_limit = 0.3
    monkeypatch.setenv("DSV4_KERNELS", "triton")

    def run(add=None, rows=slice(None), **overrides):
        moe_configured(monkeypatch, **{"gate_up_paired": False, "down_split_experts": False, "down_split_tokens": 4,
                                       **overrides})
        return moe_mod.routed(x[rows], ids[rows], weights[rows], stacks, first, cfg,
                              None if add is None else add[rows])

    for add, split_k, cases in ((shared, 1, ((True, False, True), (False, True, True), (True, True, False))),
                                (None, 2, ((True, True, True),))):
        plain = run(add, gate_up_split_k=split_k)
        for paired, down_split, fused in cases:
            got = run(add, gate_up_split_k=split_k, gate_up_paired=paired, down_split_experts=down_split,
                      fused_sum=fused)
            assert torch.equal(got, plain), (add is None, split_k, paired, down_split, fused)
            assert not tickets_any(device)
    both_on = dict(gate_up_paired=True, down_split_experts=True)
    batch = run(shared, **both_on)
    for t in range(2):
        assert torch.equal(run(shared, slice(t, t + 1), **both_on), batch[t:t + 1])


def tickets_any(device) -> bool:
    return bool(qgemv.tickets_for(1, torch.device(device)).any())


@pytest.mark.parametrize("device", DEVICES)
def test_moe_compact_rows(monkeypatch, device):
    """The prefix count: slot j runs the j-th local row in row order; slots past the local rows run nothing
    (a batch of one token with all experts remote gets 0; one with all local fills every slot)."""
    g = torch.Generator().manual_seed(8)
    D, I = 64, 32
    stacks = {k: v.to(device) for k, v in expert_stacks("fp4", 16, D, I, g).items()}
    x = torch.randn(3, D, generator=g).to(device)
    ids = torch.tensor([[16, 31, 20, 21, 22, 23], [0, 1, 2, 3, 4, 5], [17, 2, 30, 3, 18, 4]], device=device)
    weights = torch.softmax(torch.randn(3, 6, generator=g), -1).to(device)
    cfg = preset("tiny")
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    moe_configured(monkeypatch, compact=False)
    plain = moe_mod.routed(x, ids, weights, stacks, 16, cfg)
    moe_configured(monkeypatch, compact=True)
    got = moe_mod.routed(x, ids, weights, stacks, 16, cfg)
    assert torch.equal(got, plain) and torch.equal(got[1], torch.zeros_like(got[1]))


@pytest.mark.parametrize("device", DEVICES)
def test_moe_split_rows_alone(monkeypatch, device):
    """Split-K and compact rows keep a token's bits whatever the batch: each token of a batch of 3 equals the
    token alone (the split is CONFIG's, never the rows')."""
    g = torch.Generator().manual_seed(10)
    D, I = 64, 32
    stacks = {k: v.to(device) for k, v in expert_stacks("fp4", 16, D, I, g).items()}
    x = torch.randn(3, D, generator=g).to(torch.bfloat16).to(device)
    ids = torch.tensor([[16, 31, 20, 2, 22, 3], [0, 17, 2, 3, 4, 5], [17, 2, 30, 3, 18, 4]], device=device)
    weights = torch.softmax(torch.randn(3, 6, generator=g), -1).to(torch.bfloat16).to(device)
    cfg = preset("tiny")
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    moe_configured(monkeypatch, compact=True, gate_up_split_k=2)
    batch = moe_mod.routed(x, ids, weights, stacks, 16, cfg)
    for t in range(3):
        assert torch.equal(batch[t:t + 1], moe_mod.routed(x[t:t + 1], ids[t:t + 1], weights[t:t + 1], stacks, 16, cfg))


@pytest.mark.parametrize("device", DEVICES)
def test_shared_gate_up_split(monkeypatch, device):
    """The shared expert's gate/up split over K (its rows start inside a scale block): fused or second-launch
    sum give the same bits, within close_chain of the reference."""
    g = torch.Generator().manual_seed(9)
    D, I_full = 512, 192
    w1, w3 = quantised("fp8", I_full, D, g), quantised("fp8", I_full, D, g)
    rows = slice(64, 192)

    def rows_of(w):
        return QWeight(w.data[rows].contiguous(), w.scale[0:2].contiguous(), "fp8", rows.start, 0).to(device)

    a, b = rows_of(w1), rows_of(w3)
    x = torch.randn(2, D, generator=g).to(torch.bfloat16).to(device)
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    ref = moe_mod.swiglu_act(linear_mod.linear(x, a), linear_mod.linear(x, b), 0.5)
    out = {}
    for fused in (True, False):
        moe_configured(monkeypatch, shared_split_k=4, fused_sum=fused)
        out[fused] = fused_moe.shared_gate_up(x, a, b, 0.5)
    assert torch.equal(out[True], out[False]) and not tickets_any(device)
    close_chain(out[True], ref, torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
def test_routed_and_shared_gate_up_in_one_launch(monkeypatch, device):
    """CONFIG shared_launch: the routed rows' and the shared expert's kernel 1 in one launch give each its own
    launch's bits (FP4 experts with split-K 2, an FP8 shared slice starting inside a scale block with split-K 4),
    tickets back at 0; without tickets (fused_sum off) it falls back to the two launches, same bits."""
    g = torch.Generator().manual_seed(13)
    D, I, I_full = 256, 64, 192
    stacks = {k: v.to(device) for k, v in expert_stacks("fp4", 16, D, I, g).items()}
    sw1, sw3 = (quantised("fp8", I_full, D, g) for _ in range(2))
    rows = slice(64, 192)

    def rows_of(w):
        return QWeight(w.data[rows].contiguous(), w.scale[0:2].contiguous(), "fp8", rows.start, 0).to(device)

    a, b = rows_of(sw1), rows_of(sw3)
    x = torch.randn(2, D, generator=g).to(torch.bfloat16).to(device)
    ids, _, first = route_case(device)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    moe_configured(monkeypatch, gate_up_split_k=2, shared_split_k=4, block_k_fp4=64)
    alone = (fused_moe._gate_up(x, stacks["w1"], stacks["w3"], ids, first, 16, 6, 0.5, fused_moe.CONFIG["gate_up_block_n"],
                                2), fused_moe.shared_gate_up(x, a, b, 0.5))
    for fused in (True, False):
        moe_configured(monkeypatch, gate_up_split_k=2, shared_split_k=4, block_k_fp4=64, shared_launch=True,
                       fused_sum=fused)
        both = fused_moe.routed_and_shared_gate_up(x, ids, stacks["w1"], stacks["w3"], first, a, b, 0.5)
        local = (ids - first >= 0) & (ids - first < 16)  # rows of other ranks' experts are never written
        assert torch.equal(both[0][local.flatten()], alone[0][local.flatten()]), fused
        assert torch.equal(both[1], alone[1]) and not tickets_any(device), fused


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # the witness computes with the poison
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["fp4", "fp8"])
def test_moe_decode_reads_no_remote_expert(monkeypatch, device, fmt):
    """Remote experts read nothing: the local experts no token picked (stack slots 0, 3, 6, 15; the
    reference's clamp reads slot 0 for remote ids below the range) are poisoned, and the output is still finite and
    bit-identical to the output with them intact. Two runs are bit-identical."""
    g = torch.Generator().manual_seed(4)
    D, I = 128, 128
    clean = expert_stacks(fmt, 16, D, I, g)
    bad = poisoned(clean, [0, 3, 6, 15])
    clean, bad = ({k: v.to(device) for k, v in s.items()} for s in (clean, bad))
    x = torch.randn(2, D, generator=g).to(device)
    ids, weights, first = route_case(device)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    cfg = preset("tiny")
    got = moe_mod.routed(x, ids, weights, bad, first, cfg)
    assert torch.isfinite(got).all()
    assert torch.equal(got, moe_mod.routed(x, ids, weights, clean, first, cfg))
    assert torch.equal(got, moe_mod.routed(x, ids, weights, bad, first, cfg))
    # The witness: the path that clamps remote ids into the stack reads poisoned slot 0.
    monkeypatch.setattr(fused_moe, "supported", lambda x, stacks, rows=None: False)
    assert not torch.isfinite(moe_mod.routed(x, ids, weights, bad, first, cfg)).all()
    monkeypatch.undo()
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    # A token whose experts are all remote gets exactly 0.
    remote = torch.tensor([[0, 1, 2, 3, 4, 5]], device=device)
    assert torch.equal(moe_mod.routed(x[:1], remote, weights[:1], bad, first, cfg), torch.zeros(1, D, device=device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shared_expert_gate_up(monkeypatch, device, dtype):
    """The shared expert with kernel 1 on its gate/up: this rank's rows of w1/w3 start inside a scale block."""
    g = torch.Generator().manual_seed(6)
    D, I_full = 256, 384
    w1, w3, w2 = quantised("fp8", I_full, D, g), quantised("fp8", I_full, D, g), quantised("fp8", D, I_full, g)
    rows = slice(64, 256)

    def rows_of(w):
        return QWeight(w.data[rows].contiguous(), w.scale[0:2].contiguous(), "fp8", rows.start, 0)

    cols = QWeight(w2.data[:, 128:320].contiguous(), w2.scale[:, 1:3].contiguous(), "fp8", 0, 128)
    s = {"w1": rows_of(w1).to(device), "w3": rows_of(w3).to(device), "w2": cols.to(device)}
    x = torch.randn(2, D, generator=g).to(dtype).to(device)
    assert fused_moe.shared_supported(x, s["w1"], s["w3"])
    ref, got = both(monkeypatch, lambda: moe_mod.shared_expert(x, s, 0.5))
    close_chain(got, ref, dtype)


def test_moe_kernels_run_on_cuda_only_in_auto_mode(monkeypatch):
    """GPU-checked: "auto" runs them on CUDA tensors and keeps the reference on CPU ones."""
    assert fused_moe.GPU_CHECKED is True
    monkeypatch.setenv("DSV4_KERNELS", "auto")
    assert not kernels.enabled(fused_moe, torch.zeros(1))


@pytest.mark.skipif(not kernels.interpreting(), reason="the benchmark's CPU run needs Triton's interpreter")
def test_benchmark_runs_on_cpu(monkeypatch, capsys):
    """benchmarks/qgemv_bench.py end to end on `tiny` widths through the interpreter (timings faked): every
    arm it prints is correct against its reference, and the summaries come out."""
    import json
    import sys

    import benchmarks.qgemv_bench as bench

    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "L2_DEFEAT", 1 << 15)
    monkeypatch.setattr(bench, "bandwidth", lambda: 1e12)
    monkeypatch.setattr(bench, "timed", lambda fn, calls: [fn(i) for i in range(2)] and 1.0)
    monkeypatch.setattr(bench, "preset", lambda name: preset("tiny"))
    monkeypatch.setattr(sys, "argv", ["qgemv_bench", "--arms", "^(torch_dequant_gemm|torch_linear|v1_default|v2_default|"
                                      "v2_fused_sum|qgemv_v2_default|fused_default|fused_default\\+v2_default_w2)$"])
    bench.main()
    lines = capsys.readouterr().out.splitlines()
    records = [json.loads(line.split(" ", 1)[1]) for line in lines if line.startswith("QGEMV ")]
    assert records and all("error" not in r and r["max_rel_err"] <= bench.TOLERANCE for r in records), records
    fused_sum = [r for r in records if r["variant"] == "v2_fused_sum"]
    assert fused_sum and all(r["bit_equal"] for r in fused_sum)
    assert {r["variant"] for r in records if r["shape"] == "experts.routed"} == {
        "torch_dequant_gemm", "qgemv_v2_default", "fused_default"}
    assert any(line.startswith("QGEMV_LAYER") and "moe_fused_us" in line for line in lines)


@pytest.mark.slow
@pytest.mark.skipif(not kernels.interpreting(), reason="the benchmark's CPU run needs Triton's interpreter")
def test_benchmark_rows_runs_on_cpu(monkeypatch, capsys):
    """benchmarks/qgemv_bench.py --rows on `tiny` widths through the interpreter (timings faked): every arm
    within tolerance and row-exact, and the per-layer sums come out for each row count and arm."""
    import json
    import sys

    import benchmarks.qgemv_bench as bench

    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "L2_DEFEAT", 1 << 15)
    monkeypatch.setattr(bench, "bandwidth", lambda: 1e12)
    monkeypatch.setattr(bench, "timed", lambda fn, calls: [fn(i) for i in range(2)] and 1.0)
    monkeypatch.setattr(bench, "preset", lambda name: preset("tiny"))
    monkeypatch.setattr(sys, "argv", ["qgemv_bench", "--rows", "1,3", "--arms", "^(v2_rows(1|8)|v3_default)$"])
    bench.main()
    lines = capsys.readouterr().out.splitlines()
    records = [json.loads(line.split(" ", 1)[1]) for line in lines if line.startswith("QGEMV ")]
    assert records and all("error" not in r and r["max_rel_err"] <= bench.TOLERANCE and r["rows_exact"]
                           for r in records), records
    sums = [json.loads(line.split(" ", 1)[1]) for line in lines if line.startswith("QGEMV_ROWS ")]
    assert {(r["rows"], r["variant"]) for r in sums} == {(rows, v) for rows in (1, 3)
                                                         for v in ("v2_rows1", "v2_rows8", "v3_default")}


@pytest.mark.slow
@pytest.mark.skipif(not kernels.interpreting(), reason="the benchmark's CPU run needs Triton's interpreter")
def test_moe_benchmark_runs_on_cpu(monkeypatch, capsys):
    """benchmarks/moe_bench.py end to end on `tiny` widths through the interpreter (timings faked): every arm
    within tolerance of the reference, the compact and fused-sum arms bit-equal to their base, bytes counted."""
    import json
    import sys

    import benchmarks.moe_bench as bench
    import benchmarks.qgemv_bench as qb

    monkeypatch.setattr(qb, "DEVICE", "cpu")
    monkeypatch.setattr(qb, "L2_DEFEAT", 1 << 12)
    monkeypatch.setattr(qb, "timed", lambda fn, calls: [fn(i) for i in range(2)] and 1.0)
    monkeypatch.setattr(qb, "bandwidth", lambda: 1e12)
    monkeypatch.setattr(bench, "preset", lambda name: preset("tiny"))
    monkeypatch.setitem(fused_moe.CONFIG, "block_k_fp4", 32)
    monkeypatch.setitem(fused_moe.CONFIG, "block_k_fp8", 128)
    monkeypatch.setattr(sys, "argv", ["moe_bench", "--tokens", "2", "--calls", "2",
                                      "--arms", "^(base|compact|split2|split2_compact|shared_split2)$"])
    bench.main()
    lines = capsys.readouterr().out.splitlines()
    records = [json.loads(line.split(" ", 1)[1]) for line in lines if line.startswith("MOE ")]
    assert {(r["op"], r["variant"]) for r in records} == {
        *((op, v) for op in ("gate_up", "routed") for v in ("base", "compact", "split2", "split2_compact")),
        ("shared_gate_up", "base"), ("shared_gate_up", "shared_split2")}
    assert all("error" not in r and r["max_rel_err"] <= qb.TOLERANCE and r["bytes"] > 0 for r in records), records
    assert all(r["bit_equal_base"] for r in records if r["variant"] in ("base", "compact"))
    assert any(line.startswith("MOE_BEST") for line in lines)
