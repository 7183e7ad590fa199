"""The fused Triton kernels (dsv4.kernels) against their torch references in dsv4.model.

On CPU the kernels run through Triton's interpreter (conftest sets TRITON_INTERPRET=1), on a GPU
they are compiled. Tolerances: fp32 outputs within rtol = atol = 1e-6 (the kernels reduce in
another order), 1e-5 for mHC's maps (its norm is applied after the 4 x D-term projection);
bf16 outputs within one bf16 rounding step (rtol 2**-7). Whole model: the same greedy tokens and
logits within 1e-5 of the largest logit over a prefill and decode steps crossing compressed-window
closes. Eager and graph replay stay bit-identical because both run the same kernels
(tests/test_replay_gpu.py, `dsv4 gate`).
"""

from __future__ import annotations

import dataclasses

import os

import pytest
import torch

import dsv4
from dsv4 import kernels
from dsv4.config import preset
from dsv4.kernels import qgemv
from dsv4.model import hc, norm, rope
from dsv4.model import linear as linear_mod
from dsv4.formats import QWeight

pytest.importorskip("triton")

# CPU runs the kernels through Triton's interpreter, chosen at process start (conftest: when there is
# no GPU); on a GPU machine the kernels are compiled and tested on the GPU.
DEVICES = (["cpu"] if kernels.interpreting() else []) + (["cuda"] if torch.cuda.is_available() else [])

# A tiny model through every kernel: minutes under the interpreter, so its CPU case joins the slow set
# (DSV4_SLOW=1); CI keeps the kernels' own tests, and on a GPU machine the CUDA case runs.
MODEL_DEVICES = [pytest.param(d, marks=[pytest.mark.slow] if d == "cpu" else []) for d in DEVICES]


def close(a, b, dtype, tol=1e-6):
    if dtype == torch.float32:
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    else:
        torch.testing.assert_close(a.float(), b.float(), rtol=2 ** -7, atol=1e-5)


def both(monkeypatch, fn):
    """fn() under the torch reference, then under Triton."""
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    ref = fn()
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    return ref, fn()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T,hc_mult,D,dtype", [(1, 4, 64, torch.float32), (3, 4, 100, torch.bfloat16),
                                               (2, 2, 300, torch.float32), (5, 4, 4096, torch.bfloat16)])
def test_hc_pre(monkeypatch, device, T, hc_mult, D, dtype):
    cfg = dataclasses.replace(preset("tiny"), hc_mult=hc_mult)
    g = torch.Generator().manual_seed(T * D)
    h = torch.randn(T, hc_mult, D, generator=g).to(dtype).to(device)
    n = (2 + hc_mult) * hc_mult
    fn = (torch.randn(n, hc_mult * D, generator=g) * 0.05).to(device)
    base = (torch.randn(n, generator=g) * 0.1).to(device)
    scale = torch.rand(3, generator=g).to(device)
    ref, got = both(monkeypatch, lambda: hc.hc_pre(h, fn, base, scale, cfg))
    for r, k, name in zip(ref, got, ("post", "comb", "collapsed")):
        assert r.dtype == k.dtype and r.shape == k.shape, name
        close(k, r, r.dtype, tol=1e-5)
    # comb is doubly stochastic after Sinkhorn: the kernel ran all the iterations.
    torch.testing.assert_close(got[1].sum(-2), torch.ones(T, hc_mult, device=device), rtol=0, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T,hc_mult,D,dtype", [(1, 4, 64, torch.float32), (3, 4, 700, torch.bfloat16),
                                               (2, 2, 300, torch.float32)])
def test_hc_post(monkeypatch, device, T, hc_mult, D, dtype):
    g = torch.Generator().manual_seed(T * D + 1)
    out = torch.randn(T, D, generator=g).to(dtype).to(device)
    h = torch.randn(T, hc_mult, D, generator=g).to(dtype).to(device)
    post = (2 * torch.rand(T, hc_mult, generator=g)).to(device)
    comb = torch.softmax(torch.randn(T, hc_mult, hc_mult, generator=g), -1).to(device)
    ref, got = both(monkeypatch, lambda: hc.hc_post(out, post, comb, h))
    assert got.dtype == dtype and got.shape == h.shape
    if dtype == torch.float32:
        close(got, ref, dtype)
    else:
        # The reference rounds post*out and the mixed streams to bf16 before adding them; the kernel
        # rounds once. Where the two terms cancel, they differ by up to a rounding of the terms.
        scale = (post.unsqueeze(-1) * out.float().unsqueeze(-2)).abs() + torch.einsum(
            "tjk,tjd->tkd", comb, h.float().abs())
        assert bool(((got.float() - ref.float()).abs() <= 2 ** -7 * scale + 1e-6).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,weighted,dtype", [((3, 64), True, torch.float32), ((2, 5, 48), False, torch.bfloat16),
                                                  ((4, 4096), True, torch.bfloat16), ((1, 3000), True, torch.float32),
                                                  ((2, 8, 512), False, torch.float32)])
def test_rms_norm(monkeypatch, device, shape, weighted, dtype):
    g = torch.Generator().manual_seed(shape[-1])
    x = (torch.randn(*shape, generator=g) * 3).to(dtype).to(device)
    w = (torch.rand(shape[-1], generator=g) + 0.5).to(dtype).to(device)
    f = (lambda: norm.rms_norm(x, w, 1e-6)) if weighted else (lambda: norm.unweighted_rms_norm(x, 1e-6))
    ref, got = both(monkeypatch, f)
    assert ref.dtype == got.dtype == dtype
    close(got, ref, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,half,inverse,dtype", [((3, 16), 4, False, torch.float32),
                                                      ((2, 4, 24), 8, True, torch.bfloat16),
                                                      ((5, 8, 512), 32, False, torch.bfloat16),
                                                      ((4, 64), 32, True, torch.float32)])
def test_rope(monkeypatch, device, shape, half, inverse, dtype):
    g = torch.Generator().manual_seed(half)
    x = torch.randn(*shape, generator=g).to(dtype).to(device)
    angles = torch.rand(shape[0], half, generator=g) * 100
    cos, sin = angles.cos().to(device), angles.sin().to(device)
    ref, got = both(monkeypatch, lambda: rope.apply_rope(x, cos, sin, inverse=inverse))
    close(got, ref, dtype)
    # The non-rotated channels are copied exactly.
    assert torch.equal(got[..., :shape[-1] - 2 * half], x[..., :shape[-1] - 2 * half])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("verdict", [0.0, 1.0])
@pytest.mark.parametrize("with_keep", [False, True])
def test_commit(monkeypatch, device, verdict, with_keep):
    """A staged write lands where keep holds and only when the verdict is 0 (bit-exact: it copies)."""
    from dsv4.model.commit import Write
    from dsv4.kernels import commit as fused

    g = torch.Generator().manual_seed(3)
    buf = torch.randn(10, 3, 40, generator=g).to(device)
    rows = torch.randn(4, 3, 40, generator=g).to(torch.bfloat16).to(device)
    index = torch.tensor([7, 2, 9, 0], device=device)
    keep = torch.tensor([True, False, True, True], device=device) if with_keep else None
    expected = buf.clone()
    if verdict == 0:
        for i in range(4):
            if keep is None or bool(keep[i]):
                expected[index[i]] = rows[i].float()
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    assert fused.supported(buf, index, rows)
    w = Write(buf, index, rows, keep)
    fused.commit(w.buf, w.index, w.rows, w.keep, torch.tensor(verdict, device=device))
    assert torch.equal(buf, expected)


def test_unsupported_shapes_take_the_reference(monkeypatch):
    """A rope half that is not a power of two, or a strided input, runs the torch reference."""
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    x = torch.randn(3, 20)
    angles = torch.rand(3, 6)
    from dsv4.kernels import rope as fused
    assert not fused.supported(x, angles.cos())
    assert not fused.supported(torch.randn(20, 3).t(), torch.rand(3, 4))
    out = rope.apply_rope(x, angles.cos(), angles.sin())
    assert out.shape == x.shape


def test_mode_is_checked(monkeypatch):
    monkeypatch.setenv("DSV4_KERNELS", "fast")
    with pytest.raises(ValueError, match="DSV4_KERNELS='fast'"):
        kernels.use_triton(torch.zeros(1))


def test_cpu_without_interpreter_is_refused(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        kernels.launcher(norm.fused._rms_norm_kernel, torch.zeros(1))


@pytest.fixture(scope="module")
def tiny_fp8(tmp_path_factory):
    """tiny written as the official format: FP8 linears (128x128 ue8m0 blocks), FP4 experts."""
    from dsv4.checkpoint.synth import synth

    path = tmp_path_factory.mktemp("tiny_fp8")
    synth(preset("tiny"), path, seed=3, quant="fp8")
    return path


@pytest.mark.parametrize("device", MODEL_DEVICES)
@pytest.mark.parametrize("source", ["tiny", pytest.param("tiny_fp8", marks=pytest.mark.slow)])  # fp8: ~2 min
def test_tiny_model_through_the_kernels(monkeypatch, request, device, source):
    """The whole tiny model (all five layer kinds, both routers) with and without the kernels:
    a 19-token prefill then 12 greedy decode steps crossing CSA (rate 4) and HCA (rate 16) closes.
    tiny_fp8 also runs every linear and the routed and shared experts through the decode GEMV."""
    model = dsv4.load(request.getfixturevalue(source) if source == "tiny_fp8" else source, device=device,
                      dtype=torch.float32)

    def run():
        state = model.new_state(64)
        logits = [model.prefill(state, list(range(1, 20))).reshape(-1, model.cfg.vocab_size)[-1]]
        tokens = []
        for _ in range(12):
            tokens.append(int(logits[-1].argmax()))
            logits.append(model.decode(state, tokens[-1]).reshape(-1, model.cfg.vocab_size)[-1])
        return tokens, torch.stack(logits)

    (ref_tokens, ref), (tokens, got) = both(monkeypatch, run)
    assert tokens == ref_tokens
    err = float((got - ref).abs().max() / ref.abs().max())
    assert err <= 1e-5, err


# ---- the decode GEMV on stored FP8/FP4 weights ---------------------------------------------------

def quantised(fmt: str, rows: int, cols: int, g, experts: int = 0, scale_dtype=None) -> QWeight:
    from dsv4.formats import quantize_fp4, quantize_fp8

    q = quantize_fp8 if fmt == "fp8" else quantize_fp4
    parts = [q(torch.randn(rows, cols, generator=g) * 0.05) for _ in range(max(experts, 1))]
    data, scale = (torch.stack(p) for p in zip(*parts)) if experts else parts[0]
    if scale_dtype is not None:
        scale = scale.float().to(scale_dtype)
    return QWeight(data, scale, fmt)


def sliced(w: QWeight, rows: slice, cols: slice) -> QWeight:
    """A rank's slice of an FP8 weight, as tensor_specs cuts it (scales of the blocks it touches)."""
    b = 128
    return QWeight(w.data[rows, cols].contiguous(),
                   w.scale[rows.start // b:-(-rows.stop // b), cols.start // b:-(-cols.stop // b)].contiguous(),
                   "fp8", rows.start, cols.start)


QGEMV_CONFIGS = [{}, {"defer": True, "block_n": 16, "block_k_fp8": 256, "block_k_fp4": 128}]


@pytest.fixture(params=QGEMV_CONFIGS, ids=["default", "defer"])
def qgemv_config(request, monkeypatch):
    """Each launch configuration the benchmark may pick computes the same product."""
    for key, value in request.param.items():
        monkeypatch.setitem(qgemv.CONFIG, key, value)
    return request.param


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,T,N,K,dtype", [("fp8", 1, 300, 384, torch.float32), ("fp8", 3, 256, 200, torch.bfloat16),
                                             ("fp4", 1, 96, 256, torch.float32), ("fp4", 2, 64, 96, torch.bfloat16)])
def test_qgemv_linear(monkeypatch, qgemv_config, device, fmt, T, N, K, dtype):
    g = torch.Generator().manual_seed(N + K)
    w = quantised(fmt, N, K, g).to(device)
    x = torch.randn(T, K, generator=g).to(dtype).to(device)
    assert qgemv.supported(x, w, T)  # the kernel, not the fallback, is what runs
    ref, got = both(monkeypatch, lambda: linear_mod.linear(x, w))
    assert got.dtype == dtype and got.shape == (T, N)
    close(got, ref, dtype, tol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_qgemv_slices_and_fp32_scales(monkeypatch, qgemv_config, device):
    """A row slice starting inside a scale block (row0 % 128 != 0) and a column slice at a block edge;
    scales held in float32 (some releases store them so)."""
    g = torch.Generator().manual_seed(5)
    full = quantised("fp8", 512, 512, g)
    for w in (sliced(full, slice(64, 320), slice(128, 512)),
              QWeight(full.data, full.scale.float(), "fp8")):
        w = w.to(device)
        x = torch.randn(1, w.shape[1], generator=g).to(device)
        assert qgemv.supported(x, w, 1)
        ref, got = both(monkeypatch, lambda: linear_mod.linear(x, w))
        close(got, ref, torch.float32, tol=1e-5)
    # A column slice inside a block is not the kernel's: the reference runs.
    assert not qgemv.supported(x, sliced(full, slice(0, 128), slice(64, 512)), 1)


@pytest.mark.parametrize("device", DEVICES)
def test_qgemv_grouped(monkeypatch, device):
    g = torch.Generator().manual_seed(7)
    groups, O, Kg = 4, 64, 96
    w = quantised("fp8", groups * O, Kg, g).to(device)
    x = torch.randn(2, groups * Kg, generator=g).to(device)
    assert qgemv.supported(x, w, 2)
    ref, got = both(monkeypatch, lambda: linear_mod.grouped_linear(x, w, groups))
    close(got, ref, torch.float32, tol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["fp4", "fp8"])
def test_qgemv_experts(monkeypatch, qgemv_config, device, fmt):
    """Each of a token's k selected experts from a stacked weight, against gathering and dequantising."""
    g = torch.Generator().manual_seed(11)
    E, N, K, T, k = 6, 64, 128, 2, 3
    stack = quantised(fmt, N, K, g, experts=E).to(device)
    x = torch.randn(T, K, generator=g).to(device)
    ids = torch.tensor([[0, 4, 5], [2, 4, 1]], device=device).flatten()
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    got = linear_mod.expert_linear(x, stack, ids, k)
    ref = torch.einsum("rnk,rk->rn", stack.dequant(torch.float32)[ids], x.repeat_interleave(k, dim=0))
    close(got, ref, torch.float32, tol=1e-5)


def test_with_pdl_adds_launch_pdl_to_every_launch():
    """Under DSV4_PDL every Triton launch carries launch_pdl (kernels.with_pdl, in launcher and moe_gl's _launch),
    the kernel's own arguments and options untouched; without PDL the kernel itself is returned."""
    calls = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.append((grid, args, kwargs))

    k = Kernel()
    kernels._LaunchPdl(k)[(4, 2)](1, 2.0, BLOCK=16, num_warps=4)
    assert calls == [((4, 2), (1, 2.0), {"BLOCK": 16, "num_warps": 4, "launch_pdl": True})]
    assert (kernels.with_pdl(k) is k) == (not kernels.PDL)


def test_pdl_switch_is_read_at_import_and_off_under_the_interpreter():
    """DSV4_PDL=1 turns programmatic dependent launch on for a process's compiled kernels, 0 off; unset, on where
    every GPU is sm_90+ (off without CUDA); the interpreter (CPU tensors) never launches with it; another value is
    refused by name."""
    import os
    import subprocess
    import sys

    def pdl(**env) -> str:
        env = {**{k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DSV4_PDL")}, **env}
        return subprocess.run([sys.executable, "-c", "import dsv4.kernels as k; print(k.PDL)"], env=env,
                              capture_output=True, text=True, check=True).stdout.strip()

    assert pdl(DSV4_PDL="1") == "True"
    assert pdl(DSV4_PDL="0") == "False"
    assert pdl(DSV4_PDL="1", TRITON_INTERPRET="1") == "False"
    sm90 = torch.cuda.is_available() and all(torch.cuda.get_device_capability(i)[0] >= 9
                                             for i in range(torch.cuda.device_count()))
    assert pdl() == str(sm90)
    with pytest.raises(subprocess.CalledProcessError) as refused:
        pdl(DSV4_PDL="yes")
    assert "DSV4_PDL='yes'" in refused.value.stderr


# A chain of mHC boundaries (each reads the one before's streams, maps and normed row: the step's data after its
# wait) and the gate's GEMV then the router, eager and in a replayed CUDA graph: the outputs' sha256.
_PDL_CHAIN = r"""
import hashlib, sys, torch
from dsv4.kernels import dense, hc_boundary, route
dev = sys.argv[1]
g = torch.Generator().manual_seed(0)
rand = lambda *shape, scale=1.0: (torch.randn(*shape, generator=g) * scale).to(dev)
hc, D, n, links = 4, 4096 if dev == "cuda" else 256, 24, 6
fns = [rand(n, hc * D, scale=0.05) for _ in range(links)]
base, scale, norm_w = rand(n, scale=0.1), torch.rand(3, generator=g).to(dev), (rand(D) + 2).bfloat16()
gate, bias = rand(256, D, scale=D ** -0.5).bfloat16(), rand(256, scale=0.1)

def chain(x):
    streams = post = comb = None
    outs = []
    for fn in fns:
        streams, post, comb, x = hc_boundary.boundary(x, post, comb, streams, fn, base, scale, norm_w, hc, 20,
                                                      1e-6, 1e-6)
        outs += [streams, post, comb, x]
    outs += route.route(dense.linear(x, gate, stored=True), torch.zeros(x.shape[0], dtype=torch.int64, device=dev),
                        bias, None, 6, True, 1.5)
    return outs

h = hashlib.sha256()
for rows in (1, 3):
    x = rand(rows, D).bfloat16()
    eager = chain(x)
    if dev == "cuda":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            replayed = chain(x)
        for _ in range(2):
            graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(eager, replayed)), "graph != eager"
    for t in eager:
        h.update(t.contiguous().view(torch.uint8).cpu().numpy().tobytes())
print(h.hexdigest())
"""


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="programmatic dependent launch needs a GPU of compute capability 9.0+")
def test_pdl_keeps_the_bits_of_the_boundary_and_the_router():
    """DSV4_PDL=1 moves the boundary's and the router's waits behind their stored weights' loads (and launches them
    early); the bits are those of DSV4_PDL=0, eager and replayed, over a chain where each launch reads what the one
    before wrote."""
    import os
    import subprocess
    import sys

    def digest(pdl: str) -> str:
        env = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, "DSV4_PDL": pdl,
               "DSV4_KERNELS": "triton"}
        r = subprocess.run([sys.executable, "-c", _PDL_CHAIN, "cuda"], env=env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        return r.stdout.strip()

    assert digest("0") == digest("1")


@pytest.mark.parametrize("sweeps,pdl", [pytest.param(False, True, id="launched"),
                                        # DSV4_PDL is on by default on sm_90+ (session 18): CI compiles every launched
                                        # variant under it, each one's PTX checked; without it (the kernels of older
                                        # GPUs: the same code but the griddepcontrol instructions) in the slow set, as
                                        # the benchmarks' sweeps (the cold suite's 15 minutes)
                                        pytest.param(False, False, id="no_pdl", marks=pytest.mark.slow),
                                        pytest.param(True, False, id="sweeps", marks=pytest.mark.slow)])
@pytest.mark.timeout(960)  # the compile's own limit (480 s, 900 with the sweeps) decides, not the suite's 300 s
def test_every_kernel_compiles_for_sm90(sweeps, pdl):
    """The interpreter runs Python the GPU compiler refuses; compile each kernel's launched classes for sm_90 (its
    flags and options: compile_kernels._one_of_each_class; in the slow set every variant, and the tiles the
    benchmarks sweep). Cold (no Triton cache, as in CI) the classes take ~2 minutes on 2 cores.
    pdl: with DSV4_PDL=1, each variant's PTX checked for the wait and release (compile_kernels's check_pdl)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["DSV4_COMPILE_SWEEPS"] = "1" if sweeps else "0"
    env["DSV4_PDL"] = "1" if pdl else "0"
    script = Path(__file__).with_name("compile_kernels.py")
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                       timeout=900 if sweeps else 480)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "COMPILED" in r.stdout


@pytest.mark.parametrize("device", MODEL_DEVICES)
def test_refused_step_through_the_kernels_changes_nothing(monkeypatch, device):
    """The transaction with the commit kernel: a refused step leaves cache, hidden and position as they
    were; the same step then commits once the refusal is cleared."""
    from dsv4.engine import RefusalError

    monkeypatch.setenv("DSV4_KERNELS", "triton")
    model = dsv4.load("tiny", device=device, dtype=torch.float32)
    state = model.new_state(32)
    model.prefill(state, list(range(1, 16)))  # the next token closes a CSA window (rate 4)
    before = model.digests(state)
    model.arm_refusal(2, 0, 9, "moe")
    with pytest.raises(RefusalError, match="layer 2 site moe word 9"):
        model.step(state, 16, dsv4.SamplingParams(seed=2))
    assert model.digests(state) == before
    model.reset_refusals()
    state.discard()
    state2 = model.new_state(32)
    model.prefill(state2, list(range(1, 16)))
    assert model.digests(state2) == before
    model.step(state2, 16, dsv4.SamplingParams(seed=2))
    assert model.digests(state2) != before and state2.host_pos == 16


def test_auto_keeps_kernels_not_yet_checked_on_a_gpu_on_their_reference(monkeypatch):
    t = torch.zeros(1, device="cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setenv("DSV4_KERNELS", "auto")
    assert not kernels.use_triton(t, gpu_checked=False)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    assert kernels.use_triton(t, gpu_checked=False)


def test_each_kernel_module_declares_whether_it_is_gpu_checked(monkeypatch):
    """kernels.enabled reads the module's GPU_CHECKED: "auto" runs a checked kernel on CUDA only and
    an unchecked one nowhere; DSV4_KERNELS=triton runs both."""
    import types

    import importlib
    import pkgutil

    declared = {m.name: importlib.import_module(f"dsv4.kernels.{m.name}").GPU_CHECKED
                for m in pkgutil.iter_modules(kernels.__path__)}
    # every module declares it; since session 6 every one is through a GPU run but those still pending one
    # topk through session 8's calls 1-2; compile_log (DSV4_LOG_COMPILES, off) since session 14; undo (a verify step's
    # writes) from session 46 to session 49's call D; gumbel (the Gumbel-max draw, DSV4_SAMPLER=gumbel, off) since 47
    pending = {"compile_log", "gumbel"}
    # session 17's, checked on the GPU (call 4), and hc_head (session 18), each with its off switch (DSV4_ROPE_TABLE,
    # DSV4_STEP_BOOKKEEPING, DSV4_HC_HEAD)
    switched = {"rope_table": ("DSV4_ROPE_TABLE", "1"), "bookkeeping": ("DSV4_STEP_BOOKKEEPING", "1"),
                "hc_head": ("DSV4_HC_HEAD", "1")}
    expected = {name: name not in pending for name in declared}
    expected.update({name: os.environ.get(env, default) == "1" for name, (env, default) in switched.items()})
    assert declared == expected, declared
    checked, unchecked = types.SimpleNamespace(GPU_CHECKED=True), types.SimpleNamespace(GPU_CHECKED=False)
    t = torch.zeros(1, device="cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setenv("DSV4_KERNELS", "auto")
    assert kernels.enabled(checked, t) == (t.is_cuda and kernels.use_triton(t))
    assert not kernels.enabled(unchecked, t)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    assert kernels.enabled(checked, t) and kernels.enabled(unchecked, t)
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    assert not kernels.enabled(checked, t)
