"""Prefill on CPU: the grouped routed experts against the all-experts loop they replace, chunked
prefill against single steps, and the capacity refusal.

Tolerances: the grouped experts against the loop, float32: max |diff| <= 1e-5 * max |reference|
(the same products; only the order of the k-term sum and of the GEMM's reduction differ);
float64 (the exact loop fallback): 1e-12; bf16 against the float32 loop: 2**-6 of the max (the input,
both projections and the activation each round once to bf16; measured 0.006).
Prefill against single steps: tests/test_model.py's TOL (1e-4 relative, fp32).
"""

from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4.formats import quantize_fp4
from dsv4.engine import PREFILL_CHUNK, prefill_chunk
from dsv4.model import moe
from dsv4.model.moe import swiglu, swiglu_act, take
from dsv4 import kernels
from dsv4.model.moe_prefill import dequant_stack, grouped_experts
from dsv4.formats import QWeight
from dsv4.state import CapacityError
from dsv4.syncguard import NoHostSync

TOL = 1e-4  # as tests/test_model.py


def routed_all_experts(x, ids, weights, experts, first, cfg):
    """The reference: every local expert on every row, weighted by its routing weight (0 if unpicked)."""
    n = experts["w1"].data.shape[0]
    local = ids - first
    mine = (local >= 0) & (local < n)
    weights = torch.where(mine, weights, 0.0).to(x.dtype)
    out = torch.zeros_like(x)
    for e in range(n):
        coef = (weights * (local == e)).sum(dim=-1, keepdim=True)
        w1, w3, w2 = (take(experts[name], e).dequant(x.dtype) for name in ("w1", "w3", "w2"))
        out = out + coef * swiglu(x, w1, w3, w2, cfg.swiglu_limit)
    return out


def expert_stacks(n, D, I, fmt, seed):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in (("w1", (I, D)), ("w3", (I, D)), ("w2", (D, I))):
        w = torch.randn(n, *shape, generator=g) * shape[1] ** -0.5
        if fmt == "fp4":
            parts = [quantize_fp4(w[e]) for e in range(n)]
            out[name] = QWeight(torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]), "fp4")
        else:
            out[name] = QWeight(w)
    return out


def routing(T, k, total, seed):
    """Random distinct experts per token (of all ranks) and positive weights."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(total, generator=g)[:k] for _ in range(T)]).sort(-1).values
    return ids, torch.rand(T, k, generator=g) + 0.1


def run_both(x, ids, weights, experts, first, cfg):
    n = experts["w1"].data.shape[0]
    local = ids - first
    w = torch.where((local >= 0) & (local < n), weights, 0.0).to(x.dtype)
    limit = cfg.swiglu_limit
    got = grouped_experts(x, local, w, experts, lambda gate, up: swiglu_act(gate, up, limit), limit)
    return got, routed_all_experts(x, ids, weights, experts, first, cfg)


@pytest.mark.parametrize("fmt", ["dense", "fp4"])
@pytest.mark.parametrize("T,k,n,first,total", [(9, 2, 8, 0, 8), (40, 6, 16, 16, 64), (3, 4, 4, 4, 12),
                                               (64, 6, 32, 0, 32)])
def test_grouped_experts_match_the_all_experts_loop(fmt, T, k, n, first, total):
    """Empty groups, other ranks' pairs (sorted last, zeroed), experts with many rows."""
    cfg = dsv4.config.preset("tiny")
    D, I = 64, 96
    experts = expert_stacks(n, D, I, fmt, seed=T + n)
    ids, weights = routing(T, k, total, seed=T)
    x = torch.randn(T, D, generator=torch.Generator().manual_seed(1))
    got, ref = run_both(x, ids, weights, experts, first, cfg)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    assert float((got - ref).abs().max()) <= 1e-5 * float(ref.abs().max())


def test_grouped_experts_float64_loop_and_bf16():
    cfg = dsv4.config.preset("tiny")
    experts = expert_stacks(8, 32, 64, "fp4", seed=5)
    ids, weights = routing(20, 3, 16, seed=2)
    x = torch.randn(20, 32, generator=torch.Generator().manual_seed(2))
    got, ref = run_both(x.double(), ids, weights.double(), experts, 8, cfg)
    assert float((got - ref).abs().max()) <= 1e-12 * float(ref.abs().max())
    got16 = run_both(x.bfloat16(), ids, weights, experts, 8, cfg)[0]
    ref32 = run_both(x, ids, weights, experts, 8, cfg)[1]
    assert got16.dtype == torch.bfloat16
    assert float((got16.float() - ref32).abs().max()) <= 2 ** -6 * float(ref32.abs().max())


@pytest.mark.skipif(kernels.mode() == "triton" and not kernels.interpreting(),
                    reason="CPU tensors: DSV4_KERNELS=triton needs the interpreter for them")
def test_grouped_experts_make_no_host_sync():
    cfg = dsv4.config.preset("tiny")
    experts = expert_stacks(8, 64, 64, "fp4", seed=7)
    local, weights = routing(30, 2, 8, seed=3)
    x = torch.randn(30, 64)
    with NoHostSync():
        grouped_experts(x, local, weights, experts, lambda gate, up: swiglu_act(gate, up, cfg.swiglu_limit))


@pytest.fixture(scope="module")
def model():
    return dsv4.load("tiny", device="cpu", dtype=torch.float32, seed=3)


def ids(n, seed=0, vocab=512):
    return torch.randint(2, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.fixture(scope="module")
def single_steps(model):
    stream = ids(120, seed=4)
    state = model.new_state(128)
    with torch.inference_mode():
        return stream, [model.decode(state, t) for t in stream]


@torch.inference_mode()
@pytest.mark.parametrize("chunk", [5, 13, 17, 40, 101, 512])
def test_prefill_equals_single_steps(model, single_steps, chunk):
    """tiny: window 8, CSA rate 4, HCA rate 16, 8 experts x 2 per token (the grouped path from 5 rows).
    Chunks that do not divide the prompt, and chunks longer than the window and both rates."""
    stream, ref = single_steps
    N = 101
    state = model.new_state(128)
    assert rel(model.prefill(state, stream[:N], chunk_size=chunk), ref[N - 1]) <= TOL
    for j, t in enumerate(stream[N:N + 6]):
        assert rel(model.decode(state, t), ref[N + j]) <= TOL, f"chunk {chunk}: decode step {j}"


@torch.inference_mode()
def test_prefill_continues_at_unaligned_positions(model, single_steps):
    stream, ref = single_steps
    state = model.new_state(128)
    start = 0
    for n, chunk in ((3, 64), (30, 7), (41, 41), (37, 19)):  # ends at 3, 33, 74, 111
        logits = model.prefill(state, stream[start:start + n], chunk_size=chunk)
        start += n
        assert rel(logits, ref[start - 1]) <= TOL, f"prefill ending at {start}"
    assert state.host_pos == int(state.pos) == start


@torch.inference_mode()
def test_prefill_grouped_equals_the_loop_in_the_model(model, single_steps, monkeypatch):
    """The whole forward with the all-experts loop in place of the grouped experts: same logits (chunks of 45
    tokens: long chunks here, the short limit set below them)."""
    from dsv4.kernels import moe as fused_moe

    monkeypatch.setitem(fused_moe.CONFIG, "prefill_pair_tokens", 8)
    calls = []
    real = moe.grouped_experts
    monkeypatch.setattr(moe, "grouped_experts", lambda *a, **k: calls.append(1) or real(*a, **k))
    stream, _ = single_steps
    a = model.prefill(model.new_state(128), stream[:90], chunk_size=45)

    def loop(x, local, weights, experts, act, limit=None):
        return routed_all_experts(x, local, weights, experts, 0, model.cfg)

    assert len(calls) == 2 * model.cfg.num_hidden_layers
    monkeypatch.setattr(moe, "grouped_experts", loop)
    b = model.prefill(model.new_state(128), stream[:90], chunk_size=45)
    assert rel(a, b) <= 1e-5


@torch.inference_mode()
def test_a_prompt_past_the_capacity_is_refused_before_any_work(model):
    state = model.new_state(40)
    model.prefill(state, ids(10))
    before, counts = state.digest(), state.counts.tolist()
    with pytest.raises(CapacityError, match=r"31 more token\(s\) at position 10 exceed the state's capacity of 40"):
        model.prefill(state, ids(31, seed=1), chunk_size=8)
    assert state.digest() == before and state.counts.tolist() == counts and state.host_pos == 10
    fresh = model.new_state(16)
    with pytest.raises(CapacityError, match="17 more token.*capacity of 16"):
        model.prefill(fresh, ids(17))
    assert int(fresh.pos) == 0 and fresh.counts.tolist() == [0, 0]


def test_default_prefill_chunk_shrinks_with_the_capacity():
    """Flash over 2 ranks: the indexer's scores over the whole compressed store set the chunk."""
    flash = dsv4.config.preset("flash")
    got = [prefill_chunk(flash, cap, 2) for cap in (4096 + 64, 32768, 131072, 1 << 20)]
    assert got == [4096, 1024, 512, 64]
    # with the indexer's kernel its scores are 8-byte sort keys per row, not fp32 per head
    assert [prefill_chunk(flash, cap, 2, index_kernel=True) for cap in (32768, 131072 + 128, 1 << 20)] == [4096, 4096,
                                                                                                      2048]
    assert prefill_chunk(dsv4.config.preset("tiny"), 128) == PREFILL_CHUNK


@pytest.mark.skipif(not kernels.interpreting() and not torch.cuda.is_available(),
                    reason="needs triton's interpreter or a GPU")
@pytest.mark.parametrize("scale_dtype", [torch.float8_e8m0fnu, torch.float32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp4_dequant_kernel_equals_the_reference(monkeypatch, scale_dtype, dtype):
    """Bit for bit: e2m1 times a power of two is exact in both dtypes. Stacks written side by side
    (w1|w3) into one buffer; rows and bytes that do not fill a tile."""
    pytest.importorskip("triton")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(11)
    w1, w3 = [], []
    for e in range(3):  # 3 x 40 rows and 80 bytes per row: neither fills the kernel's tiles
        for stack in (w1, w3):
            stack.append(quantize_fp4(torch.randn(40, 160, generator=g)))
    w1, w3 = (QWeight(torch.stack([d for d, _ in s]).to(device),
                      torch.stack([sc for _, sc in s]).to(scale_dtype).to(device), "fp4") for s in (w1, w3))
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    ref = dequant_stack([w1, w3], dtype)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    got = dequant_stack([w1, w3], dtype)
    assert torch.equal(got, ref) and torch.equal(ref[:, :40], w1.dequant(dtype))


@pytest.mark.skipif(not kernels.interpreting() and not torch.cuda.is_available(),
                    reason="needs triton's interpreter or a GPU")
@pytest.mark.parametrize("scale_dtype", [torch.float8_e8m0fnu, torch.float32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_dequant_kernel_equals_the_reference(monkeypatch, scale_dtype, dtype):
    """dsv4.kernels.dequant's FP8 kernel against QWeight.dequant, bit for bit: whole 128 x 128 blocks (the scale
    rounded to the dtype first) and a slice starting inside its blocks (the fp32 product rounded once), sizes that
    fill no tile; every e4m3 byte (the subnormals, -0.0, NaN) and the ue8m0 bytes 255 (NaN) and, on CUDA, 0 (2**-127:
    bf16 subnormal products, which Triton's interpreter flushes to 0 in its conversions) among the scales.
    model.linear takes it for a long chunk's FP8 linear (kernels on) and gives the reference's output."""
    pytest.importorskip("triton")
    from dsv4.kernels import dequant
    from dsv4.model import linear as linear_mod

    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(12)
    data = torch.randint(0, 256, (256, 384), generator=g, dtype=torch.uint8)
    data[0, :256] = torch.arange(256, dtype=torch.uint8)  # every byte once
    scale = torch.randint(110, 140, (2, 3), generator=g, dtype=torch.uint8)
    scale[1, 2], scale[0, 1] = (0 if device == "cuda" and scale_dtype != torch.float32 else 100), 255
    scale = scale.view(torch.float8_e8m0fnu).to(scale_dtype) if scale_dtype != torch.float8_e8m0fnu else \
        scale.view(torch.float8_e8m0fnu)
    if scale_dtype == torch.float32:  # fp32 scales that are not powers of two: the roundings show
        scale = scale * torch.tensor([[1.3, 0.7, 1.1], [0.9, 1.7, 1.05]])
    whole = QWeight(data.view(torch.float8_e4m3fn).to(device), scale.to(device), "fp8")
    inside = QWeight(data[40:, 72:].contiguous().view(torch.float8_e4m3fn).to(device), scale.to(device), "fp8",
                     row0=40, col0=72)
    for w in (whole, inside):
        ref = w.dequant(dtype)
        got = dequant.fp8_dequant(w, dtype)
        bits = torch.int32 if dtype == torch.float32 else torch.int16
        nan = ref.isnan()
        assert torch.equal(got.isnan(), nan) and nan.any()
        assert torch.equal(got[~nan].view(bits), ref[~nan].view(bits)), (w.row0, w.col0)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    launched = []
    kernel = dequant.fp8_dequant
    monkeypatch.setattr(dequant, "fp8_dequant", lambda *a: launched.append(a[0].shape) or kernel(*a))
    x = torch.randn(300, 384, generator=g).to(dtype).to(device)
    ok = QWeight(torch.randn(256, 384, generator=g).to(torch.float8_e4m3fn).to(device),
                 torch.full((2, 3), 2.0 ** -3).to(scale_dtype).to(device), "fp8")
    y = linear_mod.linear(x, ok)
    assert launched == [(256, 384)] and torch.equal(y, torch.nn.functional.linear(x, ok.dequant(dtype)))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_grouped_experts_bf16_on_cuda(monkeypatch):
    """The CUTLASS grouped matmul (bf16) with Flash's k = 6 over 64 of 128 experts, FP4 weights: within
    2**-6 of the float32 loop on CPU, and bit-identical from run to run (no order-dependent atomics)."""
    monkeypatch.setenv("DSV4_KERNELS", "torch")  # the torch path on both devices, whatever the run's policy
    cfg = dsv4.config.preset("tiny")
    experts = expert_stacks(64, 256, 128, "fp4", seed=13)
    ids, weights = routing(300, 6, 128, seed=5)
    x = torch.randn(300, 256, generator=torch.Generator().manual_seed(4))
    ref = run_both(x, ids, weights, experts, 64, cfg)[1]
    on_gpu = {name: QWeight(s.data.cuda(), s.scale.cuda(), s.fmt) for name, s in experts.items()}
    a = run_both(x.bfloat16().cuda(), ids.cuda(), weights.cuda(), on_gpu, 64, cfg)[0]
    b = run_both(x.bfloat16().cuda(), ids.cuda(), weights.cuda(), on_gpu, 64, cfg)[0]
    assert torch.equal(a, b)
    assert float((a.float().cpu() - ref).abs().max()) <= 2 ** -6 * float(ref.abs().max())


def test_prefill_table_smoke_on_cpu(tmp_path, monkeypatch):
    """benchmarks/prefill_table.py on tiny: every range in a group, the sub-phase wrappers put back. Its chunks of
    8 tokens take the long chunks' path (grouped experts): the short limit is set below them."""
    import importlib.util
    import json
    from pathlib import Path

    from dsv4 import measure
    from dsv4.kernels import moe as fused_moe
    from dsv4.model import attention

    monkeypatch.setitem(fused_moe.CONFIG, "prefill_pair_tokens", 4)

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "prefill_table.py"
    spec = importlib.util.spec_from_file_location("prefill_table", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    before = (attention.linear, attention.index_topk, moe.route)
    out = tmp_path / "table.txt"
    assert script.main(["--preset", "tiny", "--device", "cpu", "--tokens", "20", "--chunk", "8", "--prime", "5",
                        "--runs", "1", "--top", "5", "--out", str(out)]) == 0
    assert (attention.linear, attention.index_topk, moe.route) == before
    records = [line.split(" ", 1) for line in out.read_text().splitlines()]
    by = lambda tag: [json.loads(r) for t, r in records if t == tag]  # noqa: E731
    (total,) = by("PREFILL_TABLE_TOTAL")
    assert total["chunks"] == 3 and total["prime"] == 5 and total["tokens"] == 20 and total["wall_s"] > 0
    groups = {g["group"] for g in by("PREFILL_GROUP")}
    assert {"attention", "compressor+indexer", "moe", "dense linears", "mhc"} <= groups
    phases = {p["phase"] for p in by("PREFILL_PHASE")}
    assert {p for p in phases if p not in measure.GROUPS} <= {"other"}
    assert "reset" not in phases and {"indexer.scores_topk", "moe.grouped_mm", "attention.linear"} <= phases
    kernels = by("PREFILL_KERNEL")
    assert len(kernels) == 5 and kernels == sorted(kernels, key=lambda r: -r["us"])


def fp4_stacks(n, D, I, scale_dtype, seed, device="cpu"):
    stacks = expert_stacks(n, D, I, "fp4", seed)
    return {k: QWeight(w.data.to(device), w.scale.to(scale_dtype).to(device), "fp4") for k, w in stacks.items()}


# prefill_moe's tests: the interpreter on CPU, the compiled kernel on a GPU
KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernels = pytest.mark.skipif(not kernels.interpreting() and not torch.cuda.is_available(),
                                   reason="needs triton's interpreter or a GPU")


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,k,n,first,total,scale_dtype", [(40, 6, 16, 16, 64, torch.float8_e8m0fnu),
                                                           (9, 2, 8, 0, 8, torch.float32),
                                                           (70, 4, 4, 4, 12, torch.float8_e8m0fnu)])
def test_prefill_moe_kernel_matches_the_dequantised_reference(monkeypatch, dtype, T, k, n, first, total,
                                                               scale_dtype):
    """dsv4.kernels.prefill_moe against grouped_experts's dequant + grouped matmul, on fresh inputs:
    other ranks' pairs, experts no pair picked, experts with more rows than a tile (70 x 4 over 4 experts
    of 12), K = I = 96 (not a whole tile). Tolerance: float32, 1e-5 of the max (ieee dots; the sums'
    order differs); bf16, 2**-7 of the max (the projections and the activation round to bf16 alike, a
    rounding flip between them moves an output by a few bf16 ulps)."""
    pytest.importorskip("triton")
    from dsv4.kernels import prefill_moe

    cfg = dsv4.config.preset("tiny")
    experts = fp4_stacks(n, 64, 96, scale_dtype, seed=T + k, device=KERNEL_DEVICE)
    ids, weights = routing(T, k, total, seed=T + 1)
    local = (ids - first).to(KERNEL_DEVICE)
    weights = torch.where((local >= 0) & (local < n), weights.to(KERNEL_DEVICE), 0.0).to(dtype)
    x = torch.randn(T, 64, generator=torch.Generator().manual_seed(T)).to(dtype).to(KERNEL_DEVICE)
    act = lambda gate, up: swiglu_act(gate, up, cfg.swiglu_limit)  # noqa: E731
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    ref = grouped_experts(x, local, weights, experts, act, cfg.swiglu_limit)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    assert prefill_moe.supported(x, [experts[w] for w in ("w1", "w3", "w2")])
    got = grouped_experts(x, local, weights, experts, act, cfg.swiglu_limit)
    again = grouped_experts(x, local, weights, experts, act, cfg.swiglu_limit)
    tol = 1e-5 if dtype == torch.float32 else 2 ** -7
    assert got.dtype == dtype and torch.equal(got, again)
    assert float((got.float() - ref.float()).abs().max()) <= tol * float(ref.float().abs().max())


def test_prefill_moe_schedule_covers_every_pair_once():
    """Tiles of bm rows of one expert each: every local pair in exactly one tile, the rest marked expert n."""
    from dsv4.kernels.prefill_moe import schedule

    counts = torch.tensor([0, 5, 16, 0, 33, 1])
    ends = torch.cumsum(counts, 0).to(torch.int32)
    P = 60  # 55 local pairs and 5 of other ranks
    expert, row = schedule(ends, P, 16)
    assert expert.shape[0] == -(-P // 16) + 6
    seen = []
    for e, r in zip(expert.tolist(), row.tolist()):
        if e == 6:
            continue
        lo, hi = int(ends[e] - counts[e]), int(ends[e])
        assert lo <= r < hi
        seen += list(range(r, min(r + 16, hi)))
    assert sorted(seen) == list(range(55))


@needs_kernels
@torch.inference_mode()
def test_prefill_with_the_fp4_expert_kernel_equals_single_steps(monkeypatch):
    """tiny with FP4 experts (a quantised checkpoint's layout), fp32: prefill chunks whose routed experts run
    dsv4.kernels.prefill_moe (every other op the torch reference) against single decode steps, which never
    take it: within TOL, and the kernel ran for every MoE layer of every chunk (of 23 and 15 tokens: long chunks
    here, the short limit set below them). On a GPU: fp32, the kernel's ieee dots."""
    pytest.importorskip("triton")
    from dsv4.checkpoint.init import random_weights
    from dsv4.checkpoint.synth import written_config
    from dsv4.engine import Model
    from dsv4.kernels import moe as fused_moe
    from dsv4.kernels import prefill_moe
    from dsv4.model import moe_prefill
    from dsv4.model.forward import Transformer
    from dsv4.parallel import Comm

    cfg = written_config(dsv4.config.preset("tiny"), "fp8")
    dev = KERNEL_DEVICE
    weights = random_weights(cfg, device=dev, dtype=torch.float32, seed=3)
    quantised = Model(cfg, Transformer(cfg, weights, Comm(cfg.num_hidden_layers, dev), dev, torch.float32))
    assert quantised.transformer.layers[0]["ffn"]["experts"]["w1"].fmt == "fp4"
    stream = ids(60, seed=5)
    state = quantised.new_state(64)
    ref = [quantised.decode(state, t) for t in stream]

    calls = []
    kernel = prefill_moe.experts

    def counted(*args):
        calls.append(1)
        return kernel(*args)

    def runs(x, experts):
        return x.shape[0] > 8 and prefill_moe.supported(x, [experts[w] for w in ("w1", "w3", "w2")])

    monkeypatch.setenv("DSV4_KERNELS", "torch")
    monkeypatch.setitem(fused_moe.CONFIG, "prefill_pair_tokens", 8)
    monkeypatch.setattr(moe_prefill, "fused_runs", runs)
    monkeypatch.setattr(moe, "fused_runs", runs)
    monkeypatch.setattr(prefill_moe, "experts", counted)
    state = quantised.new_state(64)
    start = 0
    for n, chunk in ((23, 23), (30, 15)):  # ends at 23, 53: chunks over window and rate boundaries
        logits = quantised.prefill(state, stream[start:start + n], chunk_size=chunk)
        start += n
        assert rel(logits, ref[start - 1]) <= TOL, f"prefill ending at {start}"
    assert len(calls) == 3 * cfg.num_hidden_layers
    for j, t in enumerate(stream[start:start + 4]):
        assert rel(quantised.decode(state, t), ref[start + j]) <= TOL


@needs_kernels
def test_prefill_moe_kernel_makes_no_host_sync(monkeypatch):
    """The tile schedule and both launches: no host read, no data-dependent shape (a chunk stays capturable)."""
    pytest.importorskip("triton")
    cfg = dsv4.config.preset("tiny")
    experts = fp4_stacks(8, 64, 64, torch.float8_e8m0fnu, seed=7, device=KERNEL_DEVICE)
    local, weights = (t.to(KERNEL_DEVICE) for t in routing(30, 2, 8, seed=3))
    x = torch.randn(30, 64, device=KERNEL_DEVICE)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    grouped_experts(x, local, weights, experts, lambda gate, up: swiglu_act(gate, up, cfg.swiglu_limit),
                    cfg.swiglu_limit)  # built before the guard: the first launch compiles
    with NoHostSync():
        grouped_experts(x, local, weights, experts,
                        lambda gate, up: swiglu_act(gate, up, cfg.swiglu_limit), cfg.swiglu_limit)


@pytest.mark.skipif(not kernels.interpreting(), reason="needs triton's interpreter")
def test_prefill_moe_dense_above_takes_the_dequantised_path(monkeypatch):
    pytest.importorskip("triton")
    from dsv4.kernels import prefill_moe

    cfg = dsv4.config.preset("tiny")
    experts = fp4_stacks(4, 64, 64, torch.float8_e8m0fnu, seed=2)
    local, weights = routing(20, 2, 4, seed=1)  # 40 pairs over 4 experts: 10 per expert
    x = torch.randn(20, 64)
    act = lambda gate, up: swiglu_act(gate, up, cfg.swiglu_limit)  # noqa: E731
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    ran = []
    monkeypatch.setattr(prefill_moe, "experts", lambda *a: ran.append(1))
    monkeypatch.setitem(prefill_moe.CONFIG, "dense_above", 9)
    got = grouped_experts(x, local, weights, experts, act, cfg.swiglu_limit)
    assert not ran
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    assert torch.equal(got, grouped_experts(x, local, weights, experts, act, cfg.swiglu_limit))


@pytest.mark.skipif(not kernels.interpreting(), reason="needs triton's interpreter")
def test_the_dense_path_is_chosen_only_where_the_dequant_kernel_runs(monkeypatch):
    """By default (dense_above 0) FP4 stacks take the dequant kernel + grouped matmul when that kernel runs,
    else prefill_moe's FP4 kernel (the torch dequantisation is the slow one); dense_above None: the FP4 kernel."""
    pytest.importorskip("triton")
    from dsv4.kernels import dequant, prefill_moe

    from dsv4.model.moe_prefill import _dense_chosen

    experts = fp4_stacks(4, 64, 64, torch.float8_e8m0fnu, seed=2)
    x = torch.randn(20, 64)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    assert prefill_moe.CONFIG["dense_above"] == 0 and _dense_chosen(x, experts, 40, 4)
    monkeypatch.setenv("DSV4_KERNELS", "auto")  # CPU tensors: the dequant kernel does not run in "auto"
    assert not _dense_chosen(x, experts, 40, 4)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    monkeypatch.setitem(prefill_moe.CONFIG, "dense_above", None)
    assert not _dense_chosen(x, experts, 40, 4)
    monkeypatch.setitem(prefill_moe.CONFIG, "dense_above", 10)
    assert not _dense_chosen(x, experts, 40, 4) and _dense_chosen(x, experts, 41, 4)
    assert dequant.GPU_CHECKED


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_prefill_moe_kernel_bf16_on_cuda_at_wider_shapes(monkeypatch):
    """The compiled kernel at K 1024 / 512 (several K tiles), k = 6 over 16 of 32 experts, bf16: within 2**-6
    of the float32 loop on CPU (as test_grouped_experts_bf16_on_cuda), within 2**-7 of the CUTLASS reference
    on the same device, and bit-identical from run to run (no order-dependent atomics)."""
    cfg = dsv4.config.preset("tiny")
    experts = expert_stacks(16, 1024, 512, "fp4", seed=17)
    ids, weights = routing(300, 6, 32, seed=9)
    x = torch.randn(300, 1024, generator=torch.Generator().manual_seed(8))
    monkeypatch.setenv("DSV4_KERNELS", "torch")  # the CPU reference runs no kernel, whatever the run's policy
    loop = run_both(x, ids, weights, experts, 16, cfg)[1]
    on_gpu = {name: QWeight(s.data.cuda(), s.scale.cuda(), s.fmt) for name, s in experts.items()}
    args = (x.bfloat16().cuda(), ids.cuda(), weights.cuda(), on_gpu, 16, cfg)
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    cutlass = run_both(*args)[0]
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    a, b = run_both(*args)[0], run_both(*args)[0]
    assert torch.equal(a, b)
    assert float((a.float() - cutlass.float()).abs().max()) <= 2 ** -7 * float(cutlass.float().abs().max())
    assert float((a.float().cpu() - loop).abs().max()) <= 2 ** -6 * float(loop.abs().max())


@needs_kernels
@pytest.mark.parametrize("device", [pytest.param(KERNEL_DEVICE, marks=[pytest.mark.slow] if KERNEL_DEVICE == "cpu" else [])])
@torch.inference_mode()
def test_a_short_chunk_takes_the_pair_kernels_and_equals_single_steps(monkeypatch, device):
    """tiny with FP4 experts, fp32, every kernel on: a prefill chunk of at most prefill_pair_tokens tokens runs
    its routed experts through the decode kernels (a GEMV row per (token, expert) pair) in every MoE layer, and
    its logits are those of single decode steps within TOL. (On CPU the interpreter's minutes: the slow set; the
    routing choice itself is tested by test_short_chunks_choose_the_pair_kernels.)"""
    pytest.importorskip("triton")
    from dsv4.checkpoint.init import random_weights
    from dsv4.checkpoint.synth import written_config
    from dsv4.engine import Model
    from dsv4.kernels import moe as fused_moe
    from dsv4.model.forward import Transformer
    from dsv4.parallel import Comm

    from dsv4.kernels import moe_tc

    monkeypatch.setenv("DSV4_KERNELS", "triton")
    monkeypatch.setitem(moe_tc.CONFIG, "mode", "off")  # the pair kernels (by default a chunk takes the tensor cores)
    cfg = written_config(dsv4.config.preset("tiny"), "fp8")
    dev = device
    weights = random_weights(cfg, device=dev, dtype=torch.float32, seed=3)
    model = Model(cfg, Transformer(cfg, weights, Comm(cfg.num_hidden_layers, dev), dev, torch.float32))
    stream = ids(12, seed=5)
    state = model.new_state(16)
    ref = [model.decode(state, t) for t in stream]
    calls = []
    kernel = fused_moe.routed
    monkeypatch.setattr(fused_moe, "routed", lambda *a: calls.append(a[0].shape[0]) or kernel(*a))
    assert len(stream) <= fused_moe.CONFIG["prefill_pair_tokens"]
    logits = model.prefill(model.new_state(16), stream, chunk_size=len(stream))
    assert calls == [len(stream)] * cfg.num_hidden_layers
    assert rel(logits, ref[-1]) <= TOL


@pytest.mark.skipif(not kernels.interpreting(), reason="needs triton's interpreter")
def test_short_chunks_choose_the_pair_kernels(monkeypatch):
    """A chunk of at most prefill_pair_tokens tokens runs its rows alone (rows.short_chunk, by T alone), and
    moe.routed then takes the decode kernels (kernels on) or the reference's per-pair path (kernels off, "auto"
    on CPU; PAIR_ROWS tokens a gather); more rows, outside rows_alone, the tensor-core tiles (kernels on: few
    pairs an expert, moe_tc's CONFIG long) or the grouped path."""
    pytest.importorskip("triton")
    from dsv4.kernels import moe as fused_moe
    from dsv4.kernels import moe_tc
    from dsv4.model import moe_prefill
    from dsv4.model.rows import rows_alone, short_chunk

    cfg = dsv4.config.preset("tiny")
    experts = fp4_stacks(4, 64, 64, torch.float8_e8m0fnu, seed=2)
    taken = []
    monkeypatch.setattr(fused_moe, "routed", lambda x, *a: taken.append(("pairs", x.shape[0])) or x)
    monkeypatch.setattr(moe, "_pairs", lambda x, *a: taken.append(("reference pairs", x.shape[0])) or x)
    monkeypatch.setattr(moe_prefill, "grouped_experts", lambda x, *a: taken.append(("grouped", x.shape[0])) or x)
    monkeypatch.setattr(moe_tc, "routed", lambda x, *a: taken.append(("tiles", x.shape[0])) or x)
    monkeypatch.setattr(moe, "grouped_experts", moe_prefill.grouped_experts)
    monkeypatch.setitem(fused_moe.CONFIG, "prefill_pair_tokens", 16)
    for T, kernels_on in ((16, True), (17, True), (16, False), (17, False)):
        monkeypatch.setenv("DSV4_KERNELS", "triton" if kernels_on else "auto")
        local, weights = routing(T, 2, 4, seed=1)
        with rows_alone(short_chunk(T)):
            moe.routed(torch.randn(T, 64), local, weights, experts, 0, cfg)
    pairs = [("reference pairs", moe.PAIR_ROWS)] * (16 // moe.PAIR_ROWS)  # a few tokens' experts dequantised at a time
    assert taken == [("pairs", 16), ("tiles", 17), *pairs, ("grouped", 17)]
