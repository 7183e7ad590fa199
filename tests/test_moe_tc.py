"""The routed experts on the tensor cores (dsv4.kernels.moe_tc, DSV4_MOE_TC): the plan equals torch's, the experts
agree with the pair kernels (dsv4.kernels.moe) to the reference's tolerance, and a token's bits do not depend on the
other tokens of its step (each token alone equals it in the batch).

On CPU the kernels run through Triton's interpreter (conftest: its dots sum in float64, so there the batch test
checks the plumbing: the sort, the gather, each term written to its own pair); on a GPU compiled, where it checks
the tensor cores' sums too. Tolerances: quantised_cases.close_chain (fp32 within 1e-5; an expert's bf16 chain of
roundings within 2**-6 of the largest output).
"""

from __future__ import annotations

import pytest
import torch

from dsv4 import kernels
from dsv4.config import preset
from dsv4.kernels import moe_tc
from dsv4.model import moe as moe_mod
from dsv4.model.rows import rows_alone

pytest.importorskip("triton")

from quantised_cases import DEVICES, close_chain, expert_stacks, moe_configured, per_device  # noqa: E402

# The interpreter's seconds (12 and 20 s on CPU): the slow set on CPU (CI's 15 minutes, session 38); CUDA runs
# them always
SLOW_ON_CPU = pytest.mark.slow if kernels.interpreting() else (lambda f: f)


@pytest.mark.parametrize("device,fixed", [pytest.param(d, f, marks=[pytest.mark.slow] if d == "cpu" and f else [])
                                          for d in DEVICES for f in (False, True)])
def test_plan_kernel_equals_torch(monkeypatch, device, fixed):
    """The one-program plan (sort, ends, tiles) gives torch's plan (stable sort, searchsorted, prefill_moe.schedule)
    entry for entry: pairs of other ranks' experts sorted last, an expert with more pairs than a tile holds, steps of
    1 to 40 tokens, ids of either dtype; the same compiled at its sizes per wave or once at plan_pairs' (fixed:
    CUDA's default; on CPU in the slow set: 16 s of sorting 1,024 keys in the interpreter, which the model there
    never does)."""
    monkeypatch.setitem(moe_tc.CONFIG, "plan_fixed", fixed)
    g = torch.Generator().manual_seed(5)
    for T, k, n, first in ((1, 6, 16, 16), (3, 6, 16, 0), (16, 6, 256, 0), (40, 6, 128, 128), (7, 2, 5, 3)):
        ids = torch.randint(0, 2 * n + first, (T, k), generator=g)
        ids[: T // 2 + 1, 0] = first + 1  # one expert in many pairs (> 16 at 40 tokens)
        ids = ids.to(device, torch.int64 if T % 2 else torch.int32)
        monkeypatch.setitem(moe_tc.CONFIG, "plan_pairs", 1024)
        kernel = moe_tc.plan(ids, first, n)
        monkeypatch.setitem(moe_tc.CONFIG, "plan_pairs", 0)
        ref = moe_tc.plan(ids, first, n)
        assert kernel[0].shape == (T * k,) and kernel[2].shape == (moe_tc.tiles_bound(T * k, n),)
        for name, a, b in zip(("order", "ends", "tile expert", "tile row"), kernel, ref):
            assert torch.equal(a.cpu(), b.cpu().to(a.dtype)), (T, k, n, first, name)


@pytest.mark.parametrize("device,dtype", per_device([(torch.bfloat16,)]) +
                         [pytest.param(d, torch.float32) for d in DEVICES if d == "cuda"])
def test_tensor_core_experts(monkeypatch, device, dtype):
    """A prefill chunk's routed experts on the tensor cores against the pair kernels (close_chain), with and without the shared
    output added; expert 17 in every token (more pairs than a tile of 16 on CUDA), remote experts skipped; each
    token alone has its bits in the batch; the result written into `out` when given."""
    g = torch.Generator().manual_seed(23)
    full = device == "cuda"
    D, I = (256, 128) if full else (64, 32)
    T = 20 if full else 5
    base = torch.tensor([[17, 20, 3, 25, 16, 30], [20, 17, 31, 3, 18, 19], [3, 17, 20, 22, 23, 5],
                         [26, 27, 17, 20, 3, 28], [20, 29, 17, 24, 1, 21]])
    ids = base.repeat(cdiv_rows(T, base.shape[0]), 1)[:T].to(device)
    stacks = {k: v.to(device) for k, v in expert_stacks("fp4", 16, D, I, g).items()}
    x = torch.randn(T, D, generator=g).to(dtype).to(device)
    shared = torch.randn(T, D, generator=g).to(dtype).to(device)
    weights = torch.softmax(torch.randn(T, 6, generator=g), -1).to(dtype).to(device)
    cfg = preset("tiny")
    cfg.swiglu_limit = 0.3
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    moe_configured(monkeypatch)
    if not full:
        monkeypatch.setitem(moe_tc.CONFIG, "block_k", 32)

    def run(on, rows=slice(None), add=shared, out=None):
        # the rows of a prefill chunk (4 tokens a sequence: the tensor cores) or of a decode step (the pair kernels)
        with rows_alone(True, tokens=4 if on else 1):
            return moe_mod.routed(x[rows], ids[rows], weights[rows], stacks, 16, cfg,
                                  None if add is None else add[rows], out)

    batch = run(True)
    close_chain(batch, run(False), dtype)
    close_chain(run(True, add=None), run(False, add=None), dtype)
    for t in range(T):
        assert torch.equal(run(True, slice(t, t + 1)), batch[t:t + 1]), t
    out = torch.empty_like(batch)
    assert run(True, out=out).data_ptr() == out.data_ptr() and torch.equal(out, batch)


@pytest.mark.skipif(not DEVICES, reason="needs triton's interpreter or a GPU")
@torch.inference_mode()
@pytest.mark.parametrize("order", ["natural", "planes_one", "auto"])
def test_one_dot_orders_agree_and_keep_rows_alone(monkeypatch, order):
    """DSV4_MOE_TC_ORDER natural (a K step's planes joined into one dot over the inputs in their order) and planes_one
    (one dot, the planes' order; auto, the default, takes it for 16-row tiles) against the planes' eight dots: within close_chain (natural: other sums' order),
    planes_one equal to them on CUDA (each k16 instruction the same plane's inputs, in the same sequence; the
    interpreter's dots are numpy's, in another order); each token alone equal to it in the batch, the same bits run
    to run; an unknown order is refused naming the variable."""
    device = DEVICES[0]
    full = device == "cuda"
    g = torch.Generator().manual_seed(41)
    D, I = (256, 128) if full else (64, 32)
    T = 20 if full else 5
    stacks = [v.to(device) for v in expert_stacks("fp4", 16, D, I, g).values()]
    ids = torch.stack([torch.randperm(32, generator=g)[:6] for _ in range(T)]).to(device)
    ids[:, 0] = 17
    x = torch.randn(T, D, generator=g).to(torch.bfloat16).to(device)
    weights = torch.softmax(torch.randn(T, 6, generator=g), -1).to(torch.bfloat16).to(device)
    if not full:
        monkeypatch.setitem(moe_tc.CONFIG, "block_k", 32)

    def run(order, rows=slice(None)):
        monkeypatch.setitem(moe_tc.CONFIG, "order", order)
        return moe_tc.routed(x[rows], ids[rows], weights[rows], stacks, 16, 0.3)

    one, planes = run(order), run("planes")
    close_chain(one, planes, torch.bfloat16)
    if full and order in ("planes_one", "auto"):  # auto: planes_one at CONFIG's 16 rows a tile
        assert torch.equal(one, planes)
    assert torch.equal(run(order), one)
    for t in range(T):
        assert torch.equal(run(order, slice(t, t + 1)), one[t:t + 1]), t
    with pytest.raises(ValueError, match="DSV4_MOE_TC_ORDER='rows'"):
        run("rows")


@pytest.mark.skipif(not DEVICES, reason="needs triton's interpreter or a GPU")
def test_the_mode_follows_the_step_kind(monkeypatch):
    """DSV4_MOE_TC: "chunks" (the default) takes the tensor cores for a prefill chunk's rows (tokens > 1 a sequence)
    and the pair kernels for a decode step's, whatever the rows; "all" both; "off" neither; another name is refused
    naming the variable. The shared expert's kernel 1 then runs apart (not in the routed launch)."""
    device = DEVICES[0]
    g = torch.Generator().manual_seed(4)
    D, I = (128, 128) if device == "cuda" else (64, 32)
    stacks = {k: v.to(device) for k, v in expert_stacks("fp4", 16, D, I, g).items()}
    x = torch.randn(3, D, generator=g).to(device)
    ids = torch.tensor([[16, 17, 3, 20, 21, 22]] * 3, device=device)
    weights = torch.full((3, 6), 1 / 6, device=device)
    cfg = preset("tiny")
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    moe_configured(monkeypatch)
    taken = []
    kernel = moe_tc.routed
    monkeypatch.setattr(moe_tc, "routed", lambda *a: taken.append(a[0].shape[0]) or kernel(*a))
    assert moe_tc.CONFIG["mode"] == "chunks"
    for mode, tokens, expected in (("chunks", 3, [3]), ("chunks", 1, []), ("all", 1, [3]), ("off", 3, [])):
        monkeypatch.setitem(moe_tc.CONFIG, "mode", mode)
        taken.clear()
        with rows_alone(True, tokens=tokens):
            moe_mod.routed(x, ids, weights, stacks, 16, cfg)
        assert taken == expected, (mode, tokens)
    monkeypatch.setitem(moe_tc.CONFIG, "mode", "on")
    with pytest.raises(ValueError, match="DSV4_MOE_TC='on'"), rows_alone(True, tokens=2):
        moe_mod.routed(x, ids, weights, stacks, 16, cfg)


def long_case(monkeypatch, seed: int):
    """A chunk of 48 tokens (CUDA) or 24 (interpreter), 6 experts a token among 32 (16 of them local), one local
    expert in more pairs than a tile of 16 holds; the kernels on; moe_tc.routed's tiles recorded in `taken`.
    Returns (full, stacks, ids, x, shared, weights, cfg, pairs per expert, taken)."""
    device = DEVICES[0]
    full = device == "cuda"
    g = torch.Generator().manual_seed(seed)
    D, I = (256, 128) if full else (64, 32)
    stacks = {k: v.to(device) for k, v in expert_stacks("fp4", 16, D, I, g).items()}
    T, k = (48, 6) if full else (24, 6)
    ids = torch.stack([torch.randperm(32, generator=g)[:k] for _ in range(T)])
    ids[: T // 2, 0] = 17
    ids = ids.to(device)
    x = torch.randn(T, D, generator=g).to(torch.bfloat16).to(device)
    shared = torch.randn(T, D, generator=g).to(torch.bfloat16).to(device)
    weights = torch.softmax(torch.randn(T, k, generator=g), -1).to(torch.bfloat16).to(device)
    weights = torch.where((ids >= 16) & (ids < 32), weights, 0)  # moe() zeroes other ranks' experts' weights
    cfg = preset("tiny")
    cfg.n_routed_experts, cfg.swiglu_limit = 32, 0.3
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    moe_configured(monkeypatch)
    if not full:
        monkeypatch.setitem(moe_tc.CONFIG, "block_k", 32)
    taken = []
    kernel = moe_tc.routed
    monkeypatch.setattr(moe_tc, "routed", lambda *a: taken.append(a[-1]) or kernel(*a))
    return full, stacks, ids, x, shared, weights, cfg, T * k / 32, taken  # 9 (CUDA) or 4.5 pairs per expert


@pytest.mark.skipif(not DEVICES, reason="needs triton's interpreter or a GPU")
@SLOW_ON_CPU
@torch.inference_mode()
def test_a_long_chunk_takes_the_tiles_by_its_pairs_per_expert(monkeypatch):
    """A long prefill chunk (not rows alone) takes the tensor cores while its pairs per expert (tokens * k / routed
    experts) are within CONFIG long's bounds, in the tiles of the first bound that holds them, and agrees with the
    grouped path (the stacks dequantised: the reference) within close_chain; past the last bound, or with the mode
    off, the grouped path runs. The tiles shape no pair's inputs: two tile shapes agree (close_chain)."""
    _, stacks, ids, x, shared, weights, cfg, ppe, taken = long_case(monkeypatch, 31)
    T = ids.shape[0]

    def run(long):
        monkeypatch.setitem(moe_tc.CONFIG, "long", long)
        taken.clear()
        with rows_alone(False, tokens=T):
            y = moe_mod.routed(x, ids, weights, stacks, 16, cfg, shared)
        return y, list(taken)

    reference, path = run(())
    assert path == []
    y16, path = run(((ppe / 2, 32, 64), (ppe, 16, 64), (2 * ppe, 32, 128)))
    assert path == [(16, 64)]
    close_chain(y16, reference, torch.bfloat16)
    y32, path = run(((ppe, 32, 128),))
    assert path == [(32, 128)]
    close_chain(y32, reference, torch.bfloat16)
    assert torch.equal(run(((ppe, 32, 128),))[0], y32)  # the same chunk, the same bits
    assert run(((ppe / 2, 16, 64),))[1] == []  # past the last bound: the grouped path
    monkeypatch.setitem(moe_tc.CONFIG, "mode", "off")
    assert run(((ppe, 16, 64),))[1] == []


def cdiv_rows(a: int, b: int) -> int:
    return -(-a // b)


def test_long_tile_chunks_take_each_reachable_long_tile_shape():
    """long_tile_chunks (the server's warm-up lengths): for each longest chunk, every long tile shape some chunk
    in (128, longest] takes (moe_tc.long_tiles' rule: the first bound holding tokens * k / routed experts) is taken
    by two of them, one a multiple of 16 and one not, and by no chunk outside that range."""
    from dsv4.kernels import moe as fused_moe

    shortest = fused_moe.CONFIG["prefill_pair_tokens"]
    for name in ("mini", "tiny"):
        cfg = preset(name)

        def shape(n):
            pairs = n * cfg.num_experts_per_tok / cfg.n_routed_experts
            return next(((m, b) for bound, m, b in moe_tc.CONFIG["long"] if pairs <= bound), None)

        for longest in (100, 200, 300, 2048, 8192):
            lengths = moe_mod.long_tile_chunks(cfg, longest)
            assert all(shortest < n <= longest for n in lengths), (name, longest, lengths)
            reachable = {shape(n) for n in range(shortest + 1, longest + 1)} - {None}
            assert {shape(n) for n in lengths} == reachable, (name, longest)
            for tiles in reachable:
                assert sorted(n % 16 == 0 for n in lengths if shape(n) == tiles) == [False, True], (name, tiles)
    assert moe_mod.long_tile_chunks(preset("mini"), 2048) == [512, 511, 1024, 1023, 2048, 2047]


@pytest.mark.skipif(not DEVICES, reason="needs triton's interpreter or a GPU")
@SLOW_ON_CPU
@torch.inference_mode()
def test_a_wave_takes_tiles_by_its_pairs_and_keeps_each_rows_bits(monkeypatch):
    """DSV4_MOE_TC_WAVE_TILES: a rows-alone chunk step (a grouped prefill wave) takes the long chunks' tile table by
    the step's pairs per expert, while each token alone (fewer pairs) takes the 16-row tiles; on CUDA the wave's rows
    equal the fixed shape's and each token's alone, bit for bit (a pair's bits do not depend on a tile's rows); under
    the interpreter (numpy's dots, shaped by the tile) within close_chain. Off, the fixed shape whatever the pairs."""
    full, stacks, ids, x, _, weights, cfg, ppe, taken = long_case(monkeypatch, 37)
    T = ids.shape[0]
    monkeypatch.setitem(moe_tc.CONFIG, "long", ((ppe / 8, 16, 128), (ppe, 32, 128), (4 * ppe, 64, 128)))

    def run(wave, rows=slice(None)):
        monkeypatch.setitem(moe_tc.CONFIG, "wave_tiles", wave)
        taken.clear()
        with rows_alone(True, tokens=4):
            y = moe_mod.routed(x[rows], ids[rows], weights[rows], stacks, 16, cfg)
        return y, list(taken)

    fixed, path = run(False)
    assert path == [None]
    wave, path = run(True)
    assert path == [(32, 128)]
    if full:
        assert torch.equal(wave, fixed)
    else:
        close_chain(wave, fixed, torch.bfloat16)
    for t in range(T):
        alone, path = run(True, slice(t, t + 1))
        assert path == [(16, 128)], t
        if full:
            assert torch.equal(alone, wave[t:t + 1]), t
        else:
            close_chain(alone, wave[t:t + 1], torch.bfloat16)


@pytest.mark.skipif("cuda" not in DEVICES, reason="the bf16 decode is compiled code: a GPU (the interpreter never takes it)")
@torch.inference_mode()
@pytest.mark.parametrize("tiles,order", [((16, 128), "auto"), ((16, 128), "planes"), ((32, 128), "auto"),
                                         ((64, 128), "auto"), ((16, 128), "natural")])
def test_bf16_decode_keeps_the_bits(monkeypatch, tiles, order):
    """DSV4_MOE_TC_BF16_DECODE (the FP4 weight decoded straight to bf16, two bf16 products: kernels/moe_tc.py
    _plane) equals the fp16-placement decode bit for bit, at each tile shape and order: the tensor cores get the same
    operands. Every nibble code and scale bytes over 0 .. 200 (0 reads as 0; 1 makes bf16 subnormal weights, where
    an ftz product would differ; past 128 a single factor 2**(s - 1) would overflow bf16), the gate/up and the down
    kernels, with the shared output added."""
    g = torch.Generator().manual_seed(53)
    D, I, T = 256, 128, 48
    stacks = [v.to("cuda") for v in expert_stacks("fp4", 16, D, I, g).values()]
    for w in stacks:  # the scale bytes spread over most of e8m0's range, group by group
        w.scale.view(torch.uint8).copy_(torch.randint(0, 201, w.scale.shape, generator=g, dtype=torch.uint8))
    ids = torch.stack([torch.randperm(32, generator=g)[:6] for _ in range(T)])
    ids[: T // 2, 0] = 17
    ids = ids.to("cuda")
    x = (torch.randn(T, D, generator=g) * 2.0 ** -40).to(torch.bfloat16).to("cuda")  # sums stay finite
    shared = torch.randn(T, D, generator=g).to(torch.bfloat16).to("cuda")
    weights = torch.softmax(torch.randn(T, 6, generator=g), -1).to(torch.bfloat16).to("cuda")
    monkeypatch.setitem(moe_tc.CONFIG, "order", order)

    def run(bf16):
        monkeypatch.setitem(moe_tc.CONFIG, "bf16_decode", bf16)
        return moe_tc.routed(x, ids, weights, stacks, 16, 0.3, add=shared, tiles=tiles)

    fp16, bf16 = run(False), run(True)
    assert torch.isfinite(fp16).all() and fp16.abs().max() > 0
    assert torch.equal(bf16.view(torch.int16), fp16.view(torch.int16))
