"""The dense GEMV (dsv4.kernels.dense) against F.linear in float64, row invariance, and the tiny model
batched == solo with it in every dense product (DSV4_KERNELS=triton).

On CPU the kernel runs through Triton's interpreter (conftest), on a GPU compiled. Tolerance: fp32
accumulation over K terms is within gamma_K = K * 2**-24 of the sum of |x_k w_k| (the standard bound
for any summation order), plus the output's rounding (half a unit: 2**-24 relative for fp32, 2**-8 for
bf16), against F.linear computed in float64 on the same (exactly representable) inputs.
Row invariance is exact: B rows in one launch equal each row alone, bit for bit.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import dsv4
from dsv4 import SamplingParams, kernels
from dsv4.engine import Batch
from dsv4.kernels import dense as dense_kernel
from dsv4.kernels import qgemv
from dsv4.model import rows as rows_mod
from dsv4.syncguard import NoHostSync

pytest.importorskip("triton")

DEVICES = (["cpu"] if kernels.interpreting() else []) + (["cuda"] if torch.cuda.is_available() else [])
SLOW_ON_CPU = [pytest.mark.slow] if kernels.interpreting() else []  # the interpreter's seconds; CUDA runs it always
BF16, FP32 = torch.bfloat16, torch.float32

# Small tiles so that small shapes take several K tiles and splits (the paths Flash's shapes take).
CONFIGS = {"default": {}, "small_tiles": {"block_n": 8, "block_k_bytes": 128},
           "split_3": {"block_n": 8, "block_k_bytes": 128, "split_k": 3}}


@pytest.fixture(params=list(CONFIGS))
def config(request, monkeypatch):
    for key, value in CONFIGS[request.param].items():
        monkeypatch.setitem(dense_kernel.CONFIG, key, value)
    return request.param


def within_bound(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor):
    ref = F.linear(x.double(), w.double())
    gamma = x.shape[-1] * 2.0 ** -24
    rounding = 2.0 ** -8 if got.dtype == BF16 else 2.0 ** -24
    bound = gamma * F.linear(x.double().abs(), w.double().abs()) + rounding * ref.abs()
    err = (got.double() - ref).abs()
    assert bool((err <= bound).all()), float((err - bound).max())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows,N,K,x_dtype,w_dtype", [(1, 24, 1024, FP32, FP32), (3, 100, 300, BF16, BF16),
                                                      (2, 64, 512, BF16, FP32), (4, 40, 96, FP32, BF16),
                                                      pytest.param(5, 1000, 64, FP32, FP32, marks=SLOW_ON_CPU)])
def test_matches_float64(monkeypatch, config, device, rows, N, K, x_dtype, w_dtype):
    g = torch.Generator().manual_seed(N * K + rows)
    w = (torch.randn(N, K, generator=g) * 0.05).to(w_dtype).to(device)
    x = torch.randn(rows, K, generator=g).to(x_dtype).to(device)
    assert dense_kernel.supported(x, w, rows)
    got = dense_kernel.linear(x, w)
    assert got.dtype == x_dtype and got.shape == (rows, N)
    within_bound(got, x, w)
    assert torch.equal(got, dense_kernel.linear(x, w))  # deterministic, split or not


@pytest.mark.parametrize("device,N,K,x_dtype,w_dtype", [
    pytest.param(d, *p, marks=[pytest.mark.slow] if d == "cpu" and p[0] != 12 else [])  # CI keeps one case on CPU
    for d in DEVICES for p in [(12, 512, BF16, BF16), (9, 448, FP32, BF16), (20, 256, FP32, FP32)]])
def test_fused_sum_bit_identical(monkeypatch, device, N, K, x_dtype, w_dtype):
    """The splits summed in the same launch (fused_sum) give the two-launch path's bits: rows 1..MAX_ROWS,
    splits 1/2/4/8 (each row count with two), K a whole number of chunks or not; tickets back at 0."""
    monkeypatch.setitem(dense_kernel.CONFIG, "block_n", 8)
    monkeypatch.setitem(dense_kernel.CONFIG, "block_k_bytes", 64)
    g = torch.Generator().manual_seed(N * K)
    w = (torch.randn(N, K, generator=g) * 0.05).to(w_dtype).to(device)
    for rows in range(1, dense_kernel.MAX_ROWS + 1):
        x = torch.randn(rows, K, generator=g).to(x_dtype).to(device)
        for splits in ((2, 8) if rows % 2 else (1, 4)):
            monkeypatch.setitem(dense_kernel.CONFIG, "split_k", splits)
            out = {}
            for fused in (False, True):
                monkeypatch.setitem(dense_kernel.CONFIG, "fused_sum", fused)
                out[fused] = dense_kernel.linear(x, w)
            assert torch.equal(out[True], out[False]), (rows, splits)
            assert not qgemv.tickets_for(1, x.device).any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [BF16, FP32])
def test_rows_equal_each_row_alone(monkeypatch, config, device, dtype):
    """B = 1, 3, 8, 11 rows in one launch, up to 8 in one program (CONFIG rows): each row's bits are the row's
    launched alone, one row per program (rows 1), with the splits summed in the launch or in a second one
    (the split never depends on B)."""
    g = torch.Generator().manual_seed(3)
    N, K = 20, 320
    w = torch.randn(N, K, generator=g).to(dtype).to(device)
    x = torch.randn(11, K, generator=g).to(dtype).to(device)
    monkeypatch.setitem(dense_kernel.CONFIG, "rows", 1)
    alone = [dense_kernel.linear(x[r:r + 1], w) for r in range(11)]
    monkeypatch.setitem(dense_kernel.CONFIG, "rows", 8)
    for B in (1, 3, 8, 11):
        for fused in ((False, True) if config == "split_3" else (True,)):
            monkeypatch.setitem(dense_kernel.CONFIG, "fused_sum", fused)
            got = dense_kernel.linear(x[:B], w)
            for r in range(B):
                assert torch.equal(got[r:r + 1], alone[r]), f"row {r} of {B}"
            assert not qgemv.tickets_for(1, x.device).any()
    # a row in another position of another batch: still its own bits
    assert torch.equal(dense_kernel.linear(x[[4, 0, 7]], w)[0:1], alone[4])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("K,split_k", [(256, 1), (1100, 1), (2048, 2), (300, 1)],
                         ids=["one_tile", "masked_tail", "split", "one_masked_tile"])
def test_stored_weight_keeps_the_bits(monkeypatch, device, K, split_k):
    """A stored weight's launch (EARLY: the first tile loaded before the loop, then DSV4_PDL's wait) gives the bits
    of the loop a converted weight keeps (main's): one tile, tiles whose last is masked, a split's chunk of two
    tiles; 1 and 3 rows; bf16 and fp32 weights and x."""
    monkeypatch.setitem(dense_kernel.CONFIG, "split_k", split_k)
    g = torch.Generator().manual_seed(K)
    for rows, x_dtype, w_dtype in ((1, torch.bfloat16, torch.bfloat16), (3, torch.float32, torch.float32),
                                   (3, torch.bfloat16, torch.float32)):
        w = torch.randn(20, K, generator=g).to(w_dtype).to(device)
        x = torch.randn(rows, K, generator=g).to(x_dtype).to(device)
        assert torch.equal(dense_kernel.linear(x, w, stored=True), dense_kernel.linear(x, w)), (rows, x_dtype, w_dtype)


def test_tiling_depends_on_the_weight_alone(monkeypatch):
    """Flash's shapes: few outputs split K until the launch has ~264 programs per row; the head does not, and takes
    its own K tiles (CONFIG shape_tiles: 512 bytes where the others take 1,024)."""
    assert dense_kernel.tiling(64640, 4096, BF16) == (256, 4096, 1)  # a Flash rank's head slice
    assert dense_kernel.tiling(129280, 4096, BF16) == (256, 4096, 1)  # the whole head (one rank)
    monkeypatch.setitem(dense_kernel.CONFIG, "shape_tiles", False)
    assert dense_kernel.tiling(64640, 4096, BF16) == (512, 4096, 1)
    monkeypatch.setitem(dense_kernel.CONFIG, "shape_tiles", True)
    assert dense_kernel.tiling(1024, 4096, BF16) == (512, 512, 8)  # 64 N blocks x 8 splits
    assert dense_kernel.tiling(64, 4096, BF16) == (512, 512, 8)  # as many splits as K tiles
    assert dense_kernel.tiling(24, 16384, FP32) == (256, 256, 64)  # the mix


@pytest.mark.parametrize("device", DEVICES)
def test_head_tiles(monkeypatch, device):
    """A weight the head's tiles take (CONFIG head_bytes lowered so that a small one does): within the bound of
    F.linear in float64, each of 5 rows in one launch equal to that row alone, and its own tiles (not the others')."""
    monkeypatch.setitem(dense_kernel.CONFIG, "head_bytes", 1 << 16)
    monkeypatch.setitem(dense_kernel.CONFIG, "head_block_k_bytes", 128)
    g = torch.Generator().manual_seed(11)
    N, K = 40, 1024
    w = (torch.randn(N, K, generator=g) * 0.05).to(BF16).to(device)
    x = torch.randn(5, K, generator=g).to(BF16).to(device)
    assert dense_kernel.tiling(N, K, BF16)[0] == 64
    got = dense_kernel.linear(x, w, stored=True)
    within_bound(got, x, w)
    for r in range(5):
        assert torch.equal(got[r:r + 1], dense_kernel.linear(x[r:r + 1], w, stored=True)), r


def test_program_rows():
    """Up to 8 rows per program, as a power of two; 2 where each row carries a [16, 512] fp32 tile over several
    K tiles (Flash's head slice: 64 registers per thread each), 4 for fp32 weights' [16, 256] tiles."""
    assert [dense_kernel.program_rows(rows, 512, 512) for rows in (1, 3, 8, 16)] == [1, 4, 8, 8]
    assert [dense_kernel.program_rows(rows, 512, 4096) for rows in (1, 3, 8, 16)] == [1, 2, 2, 2]
    assert dense_kernel.program_rows(16, 256, 1024) == 4


V3 = {"kernel": "v3", "v3_block_n": 16, "v3_block_k": 64}


@pytest.mark.parametrize("device,split", [
    pytest.param(d, s, marks=[pytest.mark.slow] if d == "cpu" and s == 1 else []) for d in DEVICES for s in (1, 3)])
def test_v3_rows_equal_each_row_alone(monkeypatch, device, split):
    """v3 (bf16 tensor-core tiles of 16 rows): every row of B = 1, 3, 16, 19 in one launch has the bits of that row
    launched alone, split-K off or 3 with the splits summed in the launch or in a second one; a row in another
    position of another batch too; within the float64 bound."""
    for key, value in {**V3, "split_k": split}.items():
        monkeypatch.setitem(dense_kernel.CONFIG, key, value)
    g = torch.Generator().manual_seed(4 + split)
    N, K = 40, 300
    w = (torch.randn(N, K, generator=g) * 0.05).to(BF16).to(device)
    x = torch.randn(19, K, generator=g).to(BF16).to(device)
    alone = [dense_kernel.linear(x[r:r + 1], w) for r in range(19)]
    for B in (1, 3, 16, 19):
        for fused in ((False, True) if split > 1 else (True,)):
            monkeypatch.setitem(dense_kernel.CONFIG, "fused_sum", fused)
            got = dense_kernel.linear(x[:B], w)
            for r in range(B):
                assert torch.equal(got[r:r + 1], alone[r]), f"row {r} of {B}"
            assert not qgemv.tickets_for(1, x.device).any()
    assert torch.equal(dense_kernel.linear(x[[17, 0, 7]], w)[0:1], alone[17])
    within_bound(got, x, w)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows,N,K", [(1, 24, 1024), (3, 100, 96), (17, 64, 512)])
def test_v3_matches_float64(monkeypatch, device, rows, N, K):
    """v3 within the float64 bound (split-K automatic; K below one tile, K of 16 tiles); deterministic. fp32 x or
    weight keep the v2 kernel."""
    for key, value in V3.items():
        monkeypatch.setitem(dense_kernel.CONFIG, key, value)
    g = torch.Generator().manual_seed(N * K + rows + 1)
    w = (torch.randn(N, K, generator=g) * 0.05).to(BF16).to(device)
    x = torch.randn(rows, K, generator=g).to(BF16).to(device)
    got = dense_kernel.linear(x, w)
    assert dense_kernel.uses_v3(x, w) and got.dtype == BF16 and got.shape == (rows, N)
    within_bound(got, x, w)
    assert torch.equal(got, dense_kernel.linear(x, w))
    assert not dense_kernel.uses_v3(x.float(), w) and not dense_kernel.uses_v3(x, w.float())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("K,split_k", [(64, 1), (40, 1), (300, 1), (256, 2)],
                         ids=["one_tile", "one_masked_tile", "masked_tail", "split"])
def test_v3_early_tile_keeps_the_bits(monkeypatch, device, K, split_k):
    """v3's first K tile loaded before the loop (before DSV4_PDL's wait on a stored weight, EARLY) gives the bits of
    main's loop (tests/v3_main.py), stored or not: one K tile (whole or masked), tiles whose last is masked, each
    split's chunk of two tiles; N not a whole number of blocks; 1, 16 and 17 rows."""
    from v3_main import v3_main_launches

    for key, value in {**V3, "split_k": split_k}.items():
        monkeypatch.setitem(dense_kernel.CONFIG, key, value)
    g = torch.Generator().manual_seed(K + 5)
    w = (torch.randn(20, K, generator=g) * 0.05).to(BF16).to(device)
    for rows in (1, 16, 17):
        x = torch.randn(rows, K, generator=g).to(BF16).to(device)
        with v3_main_launches():
            loop = dense_kernel.linear(x, w)
        for stored in (True, False):
            assert torch.equal(dense_kernel.linear(x, w, stored=stored), loop), (rows, stored)


def test_v3_tiling():
    """v3's split from (N, K) alone: Flash's compressor wkv (1024 outputs) splits K, a vocab slice does not."""
    assert dense_kernel.tiling3(1024, 4096) == (256, 256, 16)  # 32 N blocks x 16 splits
    assert dense_kernel.tiling3(64640, 4096) == (256, 4096, 1)
    assert dense_kernel.tiling3(24, 8) == (16, 16, 1)

@pytest.mark.skipif(not kernels.interpreting(), reason="CPU tensors under DSV4_KERNELS=triton need the interpreter")
def test_dispatch(monkeypatch):
    """rows.dense: "auto" keeps cuBLAS while GPU_CHECKED is False (and on CPU); "triton" runs the kernel
    for every supported shape, under rows_alone whatever the rows; otherwise the reference."""
    calls = []
    real = dense_kernel.linear
    monkeypatch.setattr(dense_kernel, "linear", lambda x, w, out=None, stored=False, kernel=None:
                        calls.append(x.shape[0]) or stores.append(stored) or real(x, w, out, stored, kernel))
    stores = []
    w, x = torch.randn(16, 32), torch.randn(12, 32)
    ref = F.linear(x, w)
    monkeypatch.setenv("DSV4_KERNELS", "auto")
    assert torch.equal(rows_mod.dense(x, w), ref) and calls == []
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    assert torch.equal(rows_mod.dense(x, w), ref) and calls == []  # 12 rows > MAX_ROWS outside rows_alone
    with rows_mod.rows_alone():
        within_bound(rows_mod.dense(x, w), x, w)
    rows_mod.dense(x[:3], w, source=w)
    assert calls == [12, 3] and stores == [False, True]  # stored: the weight is its source (DSV4_PDL's early load)
    half = torch.randn(2, 32, dtype=torch.float16)
    assert torch.equal(rows_mod.dense(half, w.half()), F.linear(half, w.half())) and calls == [12, 3]


PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14], [3]]
SAMPLINGS = [SamplingParams(temperature=t, seed=i) for i, t in enumerate([1.0, 0.0, 1.3])]
STEPS = 3  # sequences 0 and 1 cross a CSA close (rate 4)


@pytest.fixture(scope="module", params=DEVICES)
def tiny(request):
    return dsv4.load("tiny", device=request.param)


def prefilled(model, i):
    state = model.new_state(32)
    if len(PROMPTS[i]) > 1:
        model.prefill(state, PROMPTS[i][:-1])
    return state


@pytest.mark.slow  # ~90 s in the interpreter; the row-invariance unit tests above run in CI
def test_tiny_batched_equals_solo_through_the_kernel(monkeypatch, tiny):
    """Every dense product (the linears of the unquantised tiny, the mHC mixes, the head) in the kernel:
    a batched step's rows are each sequence's solo tokens and committed bytes, step by step."""
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    calls = []
    real = dense_kernel.linear
    monkeypatch.setattr(dense_kernel, "linear", lambda x, w, out=None, stored=False, kernel=None:
                        calls.append(x.shape[0]) or stores.append(stored) or real(x, w, out, stored, kernel))
    stores = []
    solos = []
    for i in range(len(PROMPTS)):
        state, token, out = prefilled(tiny, i), PROMPTS[i][-1], []
        for _ in range(STEPS):
            token = tiny.step(state, token, SAMPLINGS[i])
            out.append((token, state.digest()))
        solos.append(out)
    assert 1 in calls  # the kernel ran
    rows = [2, 0, 1]
    states = [prefilled(tiny, i) for i in rows]
    tokens = [PROMPTS[i][-1] for i in rows]
    calls.clear()
    for step in range(STEPS):
        tokens = list(tiny.step_batch(states, tokens, [SAMPLINGS[i] for i in rows]))
        for b, i in enumerate(rows):
            assert (tokens[b], states[b].digest()) == solos[i][step], f"sequence {i}, step {step}"
    assert len(rows) in calls  # the batch's rows went through the kernel in one launch


@pytest.mark.slow  # ~35 s in the interpreter
def test_batched_step_through_the_kernel_makes_no_host_sync(monkeypatch, tiny):
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    states = [prefilled(tiny, i) for i in range(3)]
    batch = Batch(states, tiny.device)
    batch.input.copy_(torch.tensor([PROMPTS[i][-1] for i in range(3)]))
    batch.active.copy_(torch.tensor([True, False, True]))
    batch.rows.load(SAMPLINGS[:3])
    with torch.inference_mode(), NoHostSync():
        tiny.step_batch_device(batch)


@pytest.mark.skipif(not kernels.interpreting(), reason="the benchmark's CPU run needs Triton's interpreter")
def test_benchmark_runs_on_cpu(monkeypatch, capsys):
    """benchmarks/dense_bench.py end to end on `tiny` shapes through the interpreter (timings faked): every
    kernel arm is within tolerance and row-exact, and the per-token summary covers every shape."""
    import json
    import sys

    import benchmarks.dense_bench as bench
    from dsv4.config import preset

    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "L2_DEFEAT", 1)
    monkeypatch.setattr(bench, "bandwidth", lambda: 1e12)
    monkeypatch.setattr(bench, "timed", lambda fn, calls: [fn(i) for i in range(2)] and 1.0)
    monkeypatch.setattr(bench, "preset", lambda name: preset("tiny"))
    monkeypatch.setattr(sys, "argv", ["dense_bench", "--rows", "1,3", "--arms", "^(cublas|cublas_per_row|kernel_default|kernel_v3)$"])
    bench.main()
    lines = capsys.readouterr().out.splitlines()
    records = [json.loads(line.split(" ", 1)[1]) for line in lines if line.startswith("DENSE ")]
    kernel = [r for r in records if r["arm"] in ("kernel_default", "kernel_v3")]
    assert kernel and all("error" not in r and r["max_rel_err"] <= bench.TOLERANCE and r["rows_exact"]
                          for r in kernel), kernel
    assert {r["arm"] for r in records if r["rows"] == 3} == {"cublas", "cublas_per_row", "kernel_default", "kernel_v3"}
    assert any(r["tensor_cores"] for r in records if r["arm"] == "kernel_v3")
    tokens = [json.loads(line.split(" ", 1)[1]) for line in lines if line.startswith("DENSE_TOKEN ")]
    assert [t["rows"] for t in tokens] == [1, 3] and all(t["complete"] for t in tokens), tokens
