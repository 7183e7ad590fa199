"""The routed experts of a decode step with the registers laid out by hand (dsv4.kernels.moe_gl, DSV4_MOE_GLUON):
the experts agree with the pair kernels (dsv4.kernels.moe) and with the torch reference to the reference's tolerance
(quantised_cases.close_chain: an expert's bf16 chain of roundings within 2**-6 of the largest output), a token's bits
do not depend on the other tokens of its step (each token alone equals it in the batch), remote experts are skipped
unread, the ticketless sum (a second launch) has the ticketed sum's bits.

Gluon compiles for the GPU only: on CPU the choice is never made (the CPU test checks that: the same bytes with the
switch on as off), and the kernels' tests run on a GPU.
"""

from __future__ import annotations

import pytest
import torch

from dsv4.config import preset
from dsv4.kernels import moe as fused_moe
from dsv4.kernels import moe_gl, qgemv
from dsv4.model import moe as moe_mod
from dsv4.model.rows import rows_alone

pytest.importorskip("triton")

from quantised_cases import DEVICES, close_chain, expert_stacks, poisoned  # noqa: E402

CUDA = torch.cuda.is_available() and moe_gl.gl is not None


def _case(device, dtype, T, D=2048, I=1024, seed=31):
    """(stacks of 16 local FP4 experts (ids 16..31), x, shared output, ids with remote experts, weights)."""
    g = torch.Generator().manual_seed(seed)
    stacks = {k: v.to(device) for k, v in expert_stacks("fp4", 16, D, I, g).items()}
    x = torch.randn(T, D, generator=g).to(dtype).to(device)
    shared = torch.randn(T, D, generator=g).to(dtype).to(device) * 0.1
    ids = torch.randint(0, 48, (T, 6), generator=g)
    ids[:, 0] = 17  # every token has a local expert; ids < 16 or > 31 are another rank's
    weights = torch.softmax(torch.randn(T, 6, generator=g), -1).to(dtype)
    return stacks, x, shared, ids.to(device), weights.to(device)


def _routed(stacks, x, shared, ids, weights, rows=slice(None), shared_on=True):
    cfg = preset("tiny")
    cfg.swiglu_limit = 7.0
    with rows_alone(True, tokens=1):  # a decode step's rows: the pair kernels' (moe_tc stays on prefill chunks)
        return moe_mod.routed(x[rows], ids[rows], weights[rows], stacks, 16, cfg,
                              shared[rows] if shared_on else None)


def test_one_token_register_caps_follow_the_step_and_the_programs(monkeypatch):
    """Kernel 2's one-token cap (CONFIG solo_down_maxnreg, 40 by default) goes to its tensor-core programs in a step
    of one token only: the CUDA-core programs take 92 registers (40 would spill, sm_90 census) and a batched step's
    launch is another grid; kernel 1's caps follow the step's size (solo_gate_up_maxnreg at one token, gate_up_maxnreg
    above)."""
    mma = {"MMA": 1, "U": 4}
    monkeypatch.setitem(moe_gl.CONFIG, "solo_down_maxnreg", 40)
    assert moe_gl._down_options(1, mma) == {"maxnreg": 40}
    assert moe_gl._down_options(1, {}) == {} and moe_gl._down_options(3, mma) == {}
    monkeypatch.setitem(moe_gl.CONFIG, "solo_down_maxnreg", 0)
    assert moe_gl._down_options(1, mma) == {}
    monkeypatch.setitem(moe_gl.CONFIG, "solo_gate_up_maxnreg", 64)
    monkeypatch.setitem(moe_gl.CONFIG, "gate_up_maxnreg", 128)
    assert moe_gl._gate_up_options(1) == {"maxnreg": 64} and moe_gl._gate_up_options(16) == {"maxnreg": 128}
    monkeypatch.setitem(moe_gl.CONFIG, "solo_gate_up_maxnreg", 0)
    assert moe_gl._gate_up_options(1) == {}


@pytest.mark.skipif(not DEVICES, reason="needs triton's interpreter or a GPU")
def test_never_chosen_without_the_compiler(monkeypatch):
    """With DSV4_MOE_GLUON on, a CPU step (the interpreter) keeps moe's kernels: the same bytes as with it off."""
    if "cpu" not in DEVICES:
        pytest.skip("the interpreter is not on")
    stacks, x, shared, ids, weights = _case("cpu", torch.bfloat16, 2, D=64, I=32)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    monkeypatch.setitem(fused_moe.CONFIG, "block_k_fp4", 32)
    monkeypatch.setitem(moe_gl.CONFIG, "on", False)
    off = _routed(stacks, x, shared, ids, weights)
    monkeypatch.setitem(moe_gl.CONFIG, "on", True)
    assert not moe_gl.chosen_gate_up(x, stacks["w1"], stacks["w3"])
    assert torch.equal(_routed(stacks, x, shared, ids, weights), off)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU (Gluon compiles for it only)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mma", [None, (1, 4), (1, 2)], ids=["cuda_cores", "mma1x4", "mma1x2"])
def test_gluon_experts(monkeypatch, dtype, mma):
    """20 tokens of a decode step: against the pair kernels and the torch reference (close_chain), with the shared
    output added and without; each token alone has its bits in the batch; the kernels ran (both launches). mma:
    the routed programs on the tensor cores (CONFIG mma, (mma_tiles, mma_unroll)), None the CUDA cores."""
    stacks, x, shared, ids, weights = _case("cuda", dtype, 20)
    monkeypatch.setitem(moe_gl.CONFIG, "mma", mma is not None)
    if mma:
        monkeypatch.setitem(moe_gl.CONFIG, "mma_tiles", mma[0])
        monkeypatch.setitem(moe_gl.CONFIG, "mma_unroll", mma[1])
    # which kernels take the tensor cores: kernel 1 in both mma cases (the case's scales fit bf16 and fp16), kernel 2
    # (I = 1,024 inputs) at 2 chunks a step only (4 x 4 warps x 128 inputs do not divide it: the CUDA cores)
    assert bool(moe_gl._mma(x, stacks["w1"], stacks["w3"])) == (mma is not None)
    assert bool(moe_gl._mma(x, stacks["w2"])) == (mma == (1, 2))
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    monkeypatch.setitem(moe_gl.CONFIG, "on", False)
    pairs = _routed(stacks, x, shared, ids, weights)
    pairs_plain = _routed(stacks, x, shared, ids, weights, shared_on=False)
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    ref = _routed(stacks, x, shared, ids, weights)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    monkeypatch.setitem(moe_gl.CONFIG, "on", True)
    calls = []
    for name in ("gate_up", "down"):
        fn = getattr(moe_gl, name)
        monkeypatch.setattr(moe_gl, name, lambda *a, _fn=fn, _n=name: calls.append(_n) or _fn(*a))
    batch = _routed(stacks, x, shared, ids, weights)
    assert calls[:2] == ["gate_up", "down"], calls
    close_chain(batch, pairs, dtype)
    close_chain(batch, ref, dtype)
    close_chain(_routed(stacks, x, shared, ids, weights, shared_on=False), pairs_plain, dtype)
    for t in range(x.shape[0]):
        assert torch.equal(_routed(stacks, x, shared, ids, weights, slice(t, t + 1)), batch[t:t + 1]), t


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU (Gluon compiles for it only)")
@pytest.mark.parametrize("mma", [False, True], ids=["cuda_cores", "mma"])
def test_remote_experts_unread_and_the_second_launch_sum(monkeypatch, mma):
    """Another rank's experts poisoned (NaN scales; on the tensor cores, which take only finite scales, scales of
    2**1, some 2**8 times the case's) change nothing: they are skipped before any load; the sum in a second launch
    (no tickets: a capture before any eager launch) has the ticketed sum's bits."""
    stacks, x, shared, ids, weights = _case("cuda", torch.bfloat16, 4)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    monkeypatch.setitem(moe_gl.CONFIG, "on", True)
    monkeypatch.setitem(moe_gl.CONFIG, "mma", mma)
    ids = ids.clone()
    ids[:, 1:] = torch.tensor([3, 40, 20, 47, 0], device="cuda")  # local: 17 and 20 (slots 1 and 4)
    clean = _routed(stacks, x, shared, ids, weights)
    assert torch.isfinite(clean.float()).all()
    bad = poisoned(stacks, [e for e in range(16) if e not in (1, 4)], 128 if mma else 0xFF)
    assert bool(moe_gl._mma(x, bad["w1"], bad["w3"])) == mma  # the poisoned stacks take the same kernels
    assert torch.equal(_routed(bad, x, shared, ids, weights), clean)
    monkeypatch.setattr(qgemv, "tickets_for", lambda count, device: None)
    assert torch.equal(_routed(stacks, x, shared, ids, weights), clean)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU (Gluon compiles for it only)")
@pytest.mark.parametrize("mma", [False, True], ids=["cuda_cores", "mma"])
def test_shared_expert_in_the_routed_launch(monkeypatch, mma):
    """Kernel 1 with the shared expert's FP8 gate/up in the routed launch (a rank's rows starting 64 into a scale
    block): the routed rows' bytes are the routed launch's alone; the shared rows agree with the pair kernels' within
    the bf16 activation's rounding (close); each token alone equals it in a step of 20 tokens (at another place of
    its shared program, 8, 4 or 2 tokens a program, the same bits; alone, a step of one token, a program of
    shared_tokens_solo tokens: 1 and 8 both checked, the one-token kernel is another compiled size)."""
    from quantised_cases import close, quantised

    stacks, x, _, ids, _ = _case("cuda", torch.bfloat16, 20)
    monkeypatch.setitem(moe_gl.CONFIG, "mma", mma)
    g = torch.Generator().manual_seed(8)
    full = [quantised("fp8", 2048 + 128, x.shape[1], g) for _ in range(2)]
    sw1, sw3 = (moe_gl.QWeight(w.data[64:64 + 2048].contiguous(), w.scale.contiguous(), "fp8", 64, 0).to("cuda")
                for w in full)
    args = (stacks["w1"], stacks["w3"], 16, sw1, sw3, 7.0)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    monkeypatch.setitem(moe_gl.CONFIG, "on", False)
    _, sh_pairs = fused_moe.routed_and_shared_gate_up(x, ids, *args)
    monkeypatch.setitem(moe_gl.CONFIG, "on", True)
    h, sh = fused_moe.routed_and_shared_gate_up(x, ids, *args)
    for tokens in (8, 4, 2):  # a shared program's tokens: each token's sums are its own
        monkeypatch.setitem(moe_gl.CONFIG, "shared_tokens", tokens)
        h_n, sh_n = fused_moe.routed_and_shared_gate_up(x, ids, *args)
        assert torch.equal(sh_n, sh), tokens
    mine = ((ids >= 16) & (ids < 32)).flatten()  # the rows kernel 1 writes (another rank's stay unwritten)
    assert torch.equal(h[mine], moe_gl.gate_up(x, ids, stacks["w1"], stacks["w3"], 16, 7.0)[mine])
    close(sh, sh_pairs, torch.bfloat16)
    for solo in (1, 8):
        monkeypatch.setitem(moe_gl.CONFIG, "shared_tokens_solo", solo)
        for t in range(x.shape[0]):
            h_t, sh_t = fused_moe.routed_and_shared_gate_up(x[t:t + 1], ids[t:t + 1], *args)
            rows = mine[6 * t:6 * t + 6]
            assert torch.equal(sh_t, sh[t:t + 1]) and torch.equal(h_t[rows], h[6 * t:6 * t + 6][rows]), (solo, t)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU (Gluon compiles for it only)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("unroll", [4, 2], ids=["kernel1_grouped", "both_grouped"])
@pytest.mark.parametrize("T", [2, 5, 20, 32])
def test_grouped_pairs_have_the_ungrouped_bits(monkeypatch, dtype, unroll, T):
    """CONFIG grouped (dsv4.kernels.expert_groups: up to 8 pairs of one expert a program, a pair a column of the
    MMA): kernel 1's rows (routed and shared, in one launch and alone), kernel 2's sums (ticketed and in a second
    launch) and the layer's output have the ungrouped programs' bits. Every token picks expert 17 (20 and 32 tokens:
    groups of 8 and a partial one), the others are random, a third of them another rank's. unroll 4: kernel 2 (I =
    1,024) stays on the CUDA cores, so only kernel 1 takes the table; 2: both do."""
    from quantised_cases import quantised

    stacks, x, shared, ids, weights = _case("cuda", dtype, T)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    monkeypatch.setitem(moe_gl.CONFIG, "on", True)
    monkeypatch.setitem(moe_gl.CONFIG, "mma", True)
    monkeypatch.setitem(moe_gl.CONFIG, "mma_unroll", unroll)
    assert bool(moe_gl._mma(x, stacks["w2"])) == (unroll == 2)
    g = torch.Generator().manual_seed(9)
    sw1, sw3 = (quantised("fp8", 2048, x.shape[1], g).to("cuda") for _ in range(2))
    args = (stacks["w1"], stacks["w3"], 16, sw1, sw3, 7.0)
    mine = ((ids >= 16) & (ids < 32)).flatten()
    results = {}
    for grouped in (False, True):
        monkeypatch.setitem(moe_gl.CONFIG, "grouped", grouped)
        table = moe_gl.groups_for(x, ids, stacks["w1"], stacks["w3"])
        assert (table is not None) == grouped
        h, sh = fused_moe.routed_and_shared_gate_up(x, ids, *args, table)
        alone = moe_gl.gate_up(x, ids, stacks["w1"], stacks["w3"], 16, 7.0, table)
        y = _routed(stacks, x, shared, ids, weights)
        y_plain = _routed(stacks, x, shared, ids, weights, shared_on=False)
        with monkeypatch.context() as m:
            m.setattr(qgemv, "tickets_for", lambda count, device: None)
            y_second = _routed(stacks, x, shared, ids, weights)
        results[grouped] = (h[mine], sh, alone[mine], y, y_plain, y_second)
    for name, a, b in zip(("h", "shared h", "h alone", "y", "y without shared", "y, second launch"), results[False],
                          results[True]):
        assert torch.equal(a, b), name
    assert torch.isfinite(results[True][3].float()).all()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU (Gluon compiles for it only)")
@pytest.mark.parametrize("T", [1, 16])
def test_kernel1_register_cap_keeps_the_bits(monkeypatch, T):
    """CONFIG gate_up_maxnreg (DSV4_MOE_GL_MAXNREG; 16 tokens, grouped), solo_gate_up_maxnreg and solo_down_maxnreg
    (one token): kernels 1 and 2 built with their registers capped have the uncapped builds' bits (routed and shared
    rows, one launch and alone; the layer's output, kernel 2's)."""
    from quantised_cases import quantised

    stacks, x, shared, ids, weights = _case("cuda", torch.bfloat16, T)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    monkeypatch.setitem(moe_gl.CONFIG, "on", True)
    monkeypatch.setitem(moe_gl.CONFIG, "mma", True)
    g = torch.Generator().manual_seed(9)
    sw1, sw3 = (quantised("fp8", 2048, x.shape[1], g).to("cuda") for _ in range(2))
    args = (stacks["w1"], stacks["w3"], 16, sw1, sw3, 7.0)
    mine = ((ids >= 16) & (ids < 32)).flatten()
    results = {}
    for cap in (0, 128):
        monkeypatch.setitem(moe_gl.CONFIG, "gate_up_maxnreg", cap)
        monkeypatch.setitem(moe_gl.CONFIG, "solo_gate_up_maxnreg", cap // 2)  # 64
        monkeypatch.setitem(moe_gl.CONFIG, "solo_down_maxnreg", cap * 5 // 16)  # 40
        table = moe_gl.groups_for(x, ids, stacks["w1"], stacks["w3"])
        h, sh = fused_moe.routed_and_shared_gate_up(x, ids, *args, table)
        alone = moe_gl.gate_up(x, ids, stacks["w1"], stacks["w3"], 16, 7.0, table)
        results[cap] = (h[mine], sh, alone[mine], _routed(stacks, x, shared, ids, weights))
    for name, a, b in zip(("h", "shared h", "h alone", "y"), results[0], results[128]):
        assert torch.equal(a, b), name


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU (Gluon compiles for it only)")
@pytest.mark.parametrize("T", [1, 3, 16])
def test_shared_early_keeps_the_bits(monkeypatch, T):
    """CONFIG shared_early (under PDL, where the caller says x was written two launches back: the shared programs
    first in kernel 1's grid, their sums before their wait) gives kernel 1 the bits it has without: the shared rows (a
    rank's rows starting 64 into a scale block) and the routed rows, one token (the solo sizes), 3 and 16 (grouped).
    (Session 37 call 1 also held the shared programs' K loop before and after its prefetch of the next step equal.)"""
    from quantised_cases import quantised

    stacks, x, _, ids, _ = _case("cuda", torch.bfloat16, T)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    monkeypatch.setitem(moe_gl.CONFIG, "on", True)
    monkeypatch.setitem(moe_gl.CONFIG, "mma", True)
    g = torch.Generator().manual_seed(8)
    sw1, sw3 = (moe_gl.QWeight(w.data[64:64 + 2048].contiguous(), w.scale.contiguous(), "fp8", 64, 0).to("cuda")
                for w in (quantised("fp8", 2048 + 128, x.shape[1], g) for _ in range(2)))
    mine = ((ids >= 16) & (ids < 32)).flatten()
    table = moe_gl.groups_for(x, ids, stacks["w1"], stacks["w3"])
    results = {}
    for early in (False, True):
        monkeypatch.setitem(moe_gl.CONFIG, "shared_early", early)
        h, sh = fused_moe.routed_and_shared_gate_up(x, ids, stacks["w1"], stacks["w3"], 16, sw1, sw3, 7.0, table,
                                                    early=True)
        results[early] = (h[mine], sh)
    assert torch.equal(results[True][1], results[False][1]), "shared rows"
    assert torch.equal(results[True][0], results[False][0]), "routed rows"


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU (Gluon compiles for it only)")
@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("add", [True, False], ids=["shared_added", "alone"])
def test_down_early_keeps_the_bits(monkeypatch, T, add):
    """CONFIG down_early (under PDL, where the caller says h was written two launches back: kernel 2's tensor-core
    programs make their sums before their wait, store after it) gives kernel 2 the bits it has without, with and
    without the shared output added, remote experts' zero terms included: one token (the solo step's launch, which
    takes it) and 3 (ungrouped, the early form too where groups are not given). Each launch follows kernel 1 and a
    launch between them, the model's order."""
    stacks, x, shared, ids, weights = _case("cuda", torch.bfloat16, T, D=4096, I=2048)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    monkeypatch.setitem(moe_gl.CONFIG, "on", True)
    monkeypatch.setitem(moe_gl.CONFIG, "mma", True)
    h = moe_gl.gate_up(x, ids, stacks["w1"], stacks["w3"], 16, 7.0)
    results = {}
    for early in (False, True):
        monkeypatch.setitem(moe_gl.CONFIG, "down_early", early)
        y = torch.full_like(x, float("nan"))
        between = (shared * 1).contiguous()  # a launch between h's writer and kernel 2, as the shared linear
        terms = moe_gl.down(h, ids, weights, stacks["w2"], 16, between if add else None, y, early=True)
        assert terms is None, "the ticketed sum (tickets exist after an eager launch)"
        results[early] = y.clone()
    assert not results[False].isnan().any()
    assert torch.equal(results[True], results[False])


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU (Gluon compiles for it only)")
@pytest.mark.parametrize("add", [True, False], ids=["shared_added", "alone"])
def test_down_prefetch_keeps_the_bits(monkeypatch, add):
    """CONFIG down_prefetch's pair (moe's order: kernel 1, the shared down linear releasing kernel 2 first of all,
    kernel 2 prefetching its w2 rows before its wait and reading h after it) gives kernel 2 the bits it has with the
    linear's plain release and no prefetch, remote experts' zero terms included; early asked too is not taken (h may
    still be written when a prefetching kernel 2 starts)."""
    from quantised_cases import quantised

    stacks, x, _, ids, weights = _case("cuda", torch.bfloat16, 1, D=4096, I=2048)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    monkeypatch.setitem(moe_gl.CONFIG, "on", True)
    monkeypatch.setitem(moe_gl.CONFIG, "mma", True)
    g = torch.Generator().manual_seed(46)
    sw2 = quantised("fp8", 4096, 2048, g).to("cuda")
    results = {}
    for prefetch in (False, True):
        h = moe_gl.gate_up(x, ids, stacks["w1"], stacks["w3"], 16, 7.0)
        shared = qgemv.linear(h[:1], sw2, release=prefetch)  # the shared down linear's place and release
        y = torch.full_like(x, float("nan"))
        terms = moe_gl.down(h, ids, weights, stacks["w2"], 16, shared if add else None, y, early=True,
                            prefetch=prefetch)
        assert terms is None, "the ticketed sum (tickets exist after an eager launch)"
        results[prefetch] = y.clone()
    assert not results[False].isnan().any()
    assert torch.equal(results[True], results[False])
