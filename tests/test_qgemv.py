"""qgemv's v2 and v3 kernels (split-K, FP4 words, rows per program) against the torch reference (dequantise +
matmul), on fresh random weights. The two-launch MoE decode (dsv4.kernels.moe): test_moe_decode.py and
test_moe_decode_options.py (files apart so that pytest-xdist's loadfile spreads them over CI's workers).

On CPU the kernels run through Triton's interpreter (conftest), on a GPU compiled. Tolerances: fp32
outputs within rtol = atol = 1e-5 (sums in another order); bf16 outputs within one bf16 rounding step
(rtol 2**-7, atol 1e-5: the sums may differ in their last fp32 bits and so round to the neighbouring
bf16). Determinism: two runs are bit-identical.
"""

from __future__ import annotations

import pytest
import torch

from dsv4 import kernels
from dsv4.config import preset
from dsv4.kernels import qgemv
from dsv4.model import linear as linear_mod
from dsv4.formats import QWeight

pytest.importorskip("triton")

from quantised_cases import DEVICES, both, close, per_device, quantised  # noqa: E402


# ---- qgemv v2 ------------------------------------------------------------------------------------

V2 = {"kernel": "v2", "v2_block_n": 8, "v2_block_k_fp8": 256, "v2_block_k_fp4": 64, "v2_shape_tiles": False}


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


@pytest.mark.parametrize("wo_tiles", [True, False], ids=["wo_tiles", "wide_tiles"])
def test_v2_shape_tiles_rule(monkeypatch, wo_tiles):
    """The tiles by shape (qgemv.SHAPE_TILES) at Flash's and mini's FP8 weights: one pass over K up to 2,048 inputs;
    the output linears (wo_a, wo_b) in 8-row blocks of 1,024-input tiles, 8 warps, unsplit (WO_TILES, CONFIG
    v2_wo_tiles), or, with it off, 64-row blocks split to one tile a program for the square 4,096-input slices and
    32-row blocks for 8,192 inputs (WIDE_TILES); CONFIG's tiles elsewhere, for the routed experts and FP4, and for a
    grouped weight whose groups would split a row block."""
    monkeypatch.setitem(qgemv.CONFIG, "v2_wo_tiles", wo_tiles)
    monkeypatch.setitem(qgemv.CONFIG, "v2_xq_tiles", False)  # the stacked wq_a + wkv's rule: below
    c = qgemv.CONFIG
    flat = (c["v2_block_n"], c["v2_block_k_fp8"], c["v2_num_warps"], c["v2_programs"])
    wo = (8, 1024, 8, c["v2_programs"])
    assert qgemv.v2_tiles(32768, 1024, False, False) == (16, 1024, 4, c["v2_programs"])  # wq_b
    assert qgemv.v2_tiles(4096, 2048, False, False) == (8, 2048, 8, c["v2_programs"])  # shared w2 (mini)
    assert qgemv.v2_tiles(4096, 4096, False, False, group_n=1024) == (wo if wo_tiles else (64, 512, 4, 2048))  # wo_a
    assert qgemv.v2_tiles(4096, 4096, False, False) == (wo if wo_tiles else (64, 512, 4, 2048))  # wo_b (Flash rank)
    assert qgemv.v2_tiles(4096, 8192, False, False) == (wo if wo_tiles else (32, 1024, 4, c["v2_programs"]))  # mini
    assert qgemv.v2_tiles(4096, 4096, False, False, group_n=12) == flat  # groups of 12 rows: no 8-row blocks
    assert qgemv.v2_tiles(1024, 4096, False, False) == flat  # wq_a
    assert qgemv.v2_tiles(8192, 4096, False, False, group_n=1024) == (wo if wo_tiles else flat)  # wo_a (mini)
    assert qgemv.v2_tiles(4096, 512, False, False) == flat
    monkeypatch.setitem(qgemv.CONFIG, "v2_xq_tiles", True)  # the stacked wq_a + wkv's (on by default)
    assert qgemv.v2_tiles(1536, 4096, False, False) == (8, 2048, 8, c["v2_programs"])
    assert qgemv.v2_tiles(8192, 4096, False, False, group_n=1024) == (wo if wo_tiles else flat)  # not a wo_a
    monkeypatch.setitem(qgemv.CONFIG, "v2_xq_tiles", False)
    # the output linears unsplit at their shapes: 512 or 1,024 row blocks, past the split's target
    assert qgemv.splits_for(4096 // 8, 4096 // 1024, c["v2_programs"]) == 1
    assert qgemv.v2_tiles(2048, 1024, False, True)[1] == qgemv.CONFIG["v2_block_k_fp8"]  # experts: CONFIG's
    assert qgemv.v2_tiles(2048, 1024, True, False) == (flat[0], c["v2_block_k_fp4"], flat[2], flat[3])
    # the split's target: one 512-input tile a program at a Flash rank's wo_b (64 row blocks x 8 splits)
    assert qgemv.splits_for(4096 // 64, 4096 // 512, 2048) == 8


@pytest.mark.parametrize("device,N,K", per_device([(48, 640), (24, 1536), (2048, 4096), (64, 8192)],
                                                  slow_on_cpu=[(2048, 4096), (64, 8192)]))
def test_v2_shape_tiles(monkeypatch, device, N, K):
    """The launch at SHAPE_TILES' tiles (one pass with a masked tail, K 640 and 1,536; 64-row blocks split to one
    tile a program at 2,048 x 4,096; 32-row blocks at 8,192 inputs) against the reference, and each row of three
    equal to that row alone, bit for bit."""
    monkeypatch.setitem(qgemv.CONFIG, "kernel", "v2")
    monkeypatch.setitem(qgemv.CONFIG, "v2_shape_tiles", True)
    g = torch.Generator().manual_seed(N * K)
    w = quantised("fp8", N, K, g).to(device)
    x = torch.randn(3, K, generator=g).to(torch.bfloat16).to(device)
    ref, got = both(monkeypatch, lambda: linear_mod.linear(x, w))
    close(got, ref, torch.bfloat16)
    for r in range(3):
        assert torch.equal(linear_mod.linear(x[r:r + 1], w), got[r:r + 1]), r


@pytest.mark.parametrize("device", DEVICES)
def test_v2_xq_tiles(monkeypatch, device):
    """The stacked wq_a + wkv's tiles (CONFIG v2_xq_tiles: 8-row blocks of 2,048 inputs, split in two at K 4,096)
    against the reference, and each row of three equal to that row alone, bit for bit."""
    monkeypatch.setitem(qgemv.CONFIG, "kernel", "v2")
    monkeypatch.setitem(qgemv.CONFIG, "v2_xq_tiles", True)
    g = torch.Generator().manual_seed(40)
    w = quantised("fp8", 24, 4096, g).to(device)
    x = torch.randn(3, 4096, generator=g).to(torch.bfloat16).to(device)
    ref, got = both(monkeypatch, lambda: linear_mod.linear(x, w))
    close(got, ref, torch.bfloat16)
    for r in range(3):
        assert torch.equal(linear_mod.linear(x[r:r + 1], w), got[r:r + 1]), r


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


# on CPU the release is no instruction (PDL is CUDA's): the interpreter's 29 s check the same program twice; slow set
@pytest.mark.parametrize("device", [pytest.param(d, marks=pytest.mark.slow) if d == "cpu" else d for d in DEVICES])
def test_v2_release_keeps_the_bits(monkeypatch, device):
    """linear's release (the next kernel released before this one's wait: moe_gl CONFIG down_prefetch's shared down
    linear; RELEASE under DSV4_PDL, nothing on CPU) gives the launch without it its bits: the shared expert's down
    shape (FP8, 2,048 inputs) and a split one, 1 and 3 rows; the kernel after it (another linear) its own."""
    for key, value in V2.items():
        monkeypatch.setitem(qgemv.CONFIG, key, value)
    g = torch.Generator().manual_seed(45)
    for N, K in ((256, 2048), (128, 4096)):
        w, after = quantised("fp8", N, K, g).to(device), quantised("fp8", 64, N, g).to(device)
        for rows in (1, 3):
            x = torch.randn(rows, K, generator=g).to(torch.bfloat16).to(device)
            plain = qgemv.linear(x, w)
            plain_after = qgemv.linear(plain, after)
            released = qgemv.linear(x, w, release=True)
            assert torch.equal(released, plain), (N, K, rows)
            assert torch.equal(qgemv.linear(released, after), plain_after), (N, K, rows)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pre", [2, 4, 8])
def test_v2_early_tiles_keep_the_bits(monkeypatch, device, pre):
    """CONFIG v2_early_tiles (DSV4_QGEMV_EARLY_TILES: the first tiles of a stored FP8 weight loaded before the wait,
    summed after it in order) gives the launch of one early tile its bits: 4 unrolled tiles a program (1,024 inputs
    in 256-input tiles, unsplit), fewer than asked (pre 8), and a masked tail (K 900); 1 and 3 rows."""
    for key, value in {**V2, "v2_split_k": 1}.items():
        monkeypatch.setitem(qgemv.CONFIG, key, value)
    g = torch.Generator().manual_seed(pre)
    for K in (1024, 900):
        w = quantised("fp8", 24, K, g).to(device)
        for rows in (1, 3):
            x = torch.randn(rows, K, generator=g).to(torch.bfloat16).to(device)
            monkeypatch.setitem(qgemv.CONFIG, "v2_early_tiles", 1)
            one = qgemv.linear(x, w)
            monkeypatch.setitem(qgemv.CONFIG, "v2_early_tiles", pre)
            assert torch.equal(qgemv.linear(x, w), one), (K, rows)


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
    slow_on_cpu=[("fp8", 9, 1280), ("fp4", 12, 256), ("fp4", 8, 320)]))  # CPU: the ticket sum once (36 s an FP4 case)
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
        each_row_alone(monkeypatch, fn, torch.randn(11, K, generator=g).to(dtype).to(device), w.to(device), splits,
                       sizes=(1, 3, 8, 11), alone={"v2_rows": 1}, batched={"v2_rows": 8})


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
        each_row_alone(monkeypatch, fn, torch.randn(19, K, generator=g).to(dtype).to(device), w.to(device), splits)


def each_row_alone(monkeypatch, fn, x, w, splits, sizes=(1, 3, 16, 19), alone=(), batched=()):
    """Every row of fn(x[:B], w) for B in sizes (v3's: one row tile with padding, a full one, two tiles) equal to
    that row launched alone (under qgemv CONFIG `alone`, the batches under `batched`), the splits summed in the
    launch (tickets back at 0) and, split, in a second launch; a row in another position of another batch too."""
    for key, value in dict(alone).items():
        monkeypatch.setitem(qgemv.CONFIG, key, value)
    rows = [fn(x[r:r + 1], w) for r in range(max(sizes))]
    for key, value in dict(batched).items():
        monkeypatch.setitem(qgemv.CONFIG, key, value)
    for B in sizes:
        for fused in ((False, True) if splits > 1 else (True,)):
            monkeypatch.setitem(qgemv.CONFIG, "v2_fused_sum", fused)
            got = fn(x[:B], w)
            for r in range(B):
                assert torch.equal(got[r:r + 1], rows[r]), (B, fused, r)
            assert not qgemv.tickets_for(1, x.device).any()
    last = max(sizes) - 1
    assert torch.equal(fn(x[[last, 2, 0]], w)[0:1], rows[last])


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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("K,split_k", [(400, 1), (1152, 2), (1700, 1)],
                         ids=["masked_second_tile", "split_with_a_masked_tail", "seven_tiles"])
def test_unrolled_tile_loop_keeps_the_bits(monkeypatch, device, K, split_k):
    """v2's FP8 tile loop unrolled at compile time or not (v2_unroll): the same bits (test_v2_early_tile_keeps_the_bits
    holds the first tile summed before the loop to the plain loop). Two to seven tiles a program, the last masked,
    1 and 9 rows (v2_rows groups of 8 with a repeated last row). Two splits (summed by the ticket) whose last runs past K; bf16 and fp32 x,
    and the grouped wo_a; against float64 too."""
    row_counts = (1, 9)
    config = {"kernel": "v2", "v2_shape_tiles": False, "v2_block_k_fp8": 256}
    for key, value in {**config, "v2_split_k": split_k}.items():
        monkeypatch.setitem(qgemv.CONFIG, key, value)
    g = torch.Generator().manual_seed(K + 5)
    w = quantised("fp8", 40, K, g).to(device)
    grouped = quantised("fp8", 2 * 32, K, g).to(device)

    def forms(fn):
        outs = []
        for unroll in (False, True):
            monkeypatch.setitem(qgemv.CONFIG, "v2_unroll", unroll)
            outs.append(fn())
        return outs

    for rows, dtype in zip(row_counts, (torch.bfloat16, torch.float32, torch.bfloat16)):
        x = torch.randn(rows, K, generator=g).to(dtype).to(device)
        loop, unrolled = forms(lambda: qgemv.linear(x, w))
        assert torch.equal(loop, unrolled), (rows, dtype)
        close(loop, torch.nn.functional.linear(x.double(), w.dequant(torch.float64)).to(dtype), dtype)
        x2 = torch.randn(rows, 2 * K, generator=g).to(dtype).to(device)
        loop, unrolled = forms(lambda: qgemv.grouped_linear(x2, grouped, 2))
        assert torch.equal(loop, unrolled), ("grouped", rows, dtype)


@pytest.mark.skipif(not kernels.interpreting(), reason="the benchmark's CPU run needs Triton's interpreter")
@pytest.mark.slow  # 15 s of interpreter (CI's 15 minutes, session 38); the benchmark runs on the GPU in device calls
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
