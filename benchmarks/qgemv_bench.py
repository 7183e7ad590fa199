"""The decode GEMV (dsv4.kernels.qgemv) and the two-launch MoE decode (dsv4.kernels.moe) against the
device's bandwidth, per Flash weight shape of one rank and per launch configuration, with the
dequantise + GEMM reference beside them.

One GPU; about 3 minutes (most of it Triton compiling each variant; --arms filters them). The
bandwidth is measured in the same run: a device-to-device copy of 2 GiB, bytes read plus written per
second, median of 20. Each arm is captured as `calls` calls in one CUDA graph, replayed 10 times; the
figure is the median per call (with DSV4_PDL=1, `pdl` in the records, a call's first weight tile is fetched
while the call before it runs). The calls rotate over copies of the weight (at least 256 MiB of them)
so that no call finds its weight in the 50 MB L2 left by the previous one. Bytes are what a call
must read: the FP8/FP4 data and scales it uses (for the routed experts: the 3 local experts' of the
6 selected). Before timing, each arm's output is compared with the reference: max_rel_err is the
largest absolute difference over the largest reference magnitude; a variant that must give another's
bits (TWINS: the fused split sum) is compared bit for bit (bit_equal). launches: the kernels one
call launches (torch profiler, on CUDA).

Shapes are rank 0's slices of a `flash` layer over --world ranks. bf16 linears (the compressors,
the router, the indexer's weights_proj) take F.linear and are timed for the picture only.

Prints:
  BANDWIDTH {...}
  QGEMV {"shape", "variant", "us", "bytes", "gb_s", "fraction", "max_rel_err", ...} per shape and variant
  QGEMV_LAYER {...} per qgemv variant: one layer's quantised linears (each once) and routed + shared
    experts with the variant's MoE path, summed
  QGEMV_BEST {...} per shape: the fastest variant within tolerance
With --rows 1,4,16,32 (only these arms): a batched decode step's rows on each FP8 linear, one program per row
against v2_rows rows per program and v3's tensor-core tiles of 16 rows (ROWS_VARIANTS), each checked row by row
against that row launched alone under the same arm (rows_exact):
  QGEMV {..., "rows", "rows_exact"} per shape ("wq_a x16"), rows and variant
  QGEMV_ROWS {"rows", "variant", "us", "fraction", ...}: one layer's FP8 linears summed
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import math
import os
import re
import statistics

import torch
import torch.nn.functional as F

from dsv4 import kernels
from dsv4.config import preset
from dsv4.kernels import moe as fused_moe
from dsv4.kernels import qgemv, qgemv_mma
from dsv4.model import moe as moe_mod
from dsv4.formats import QWeight
from dsv4.receipts import emit

V1_DEFER = {"defer": True, "block_n": 16, "block_k_fp8": 256, "block_k_fp4": 128, "num_warps": 4}
FLAT = {"kernel": "v2", "v2_shape_tiles": False}  # CONFIG's tiles for every shape (main before session 15)
QGEMV_VARIANTS = {  # qgemv.CONFIG overrides
    "v1_default": {},
    "v1_defer_n16_k256_w4": V1_DEFER,
    "v2_default": {"kernel": "v2"},  # with qgemv.SHAPE_TILES (the tiles by the weight's shape)
    "v2_flat": FLAT,
    "v2_n8": {**FLAT, "v2_block_n": 8},
    "v2_n32_w8": {**FLAT, "v2_block_n": 32, "v2_num_warps": 8},
    "v2_n8_k1024_w8": {**FLAT, "v2_block_n": 8, "v2_block_k_fp8": 1024, "v2_block_k_fp4": 512, "v2_num_warps": 8},
    "v2_programs528": {**FLAT, "v2_programs": 528},
    # session 15's sweep: wider K tiles and more warps (more bytes in flight a program)
    "v2_k1024": {**FLAT, "v2_block_k_fp8": 1024},
    "v2_k1024_w8": {**FLAT, "v2_block_k_fp8": 1024, "v2_num_warps": 8},
    "v2_n32_w8_k1024": {**FLAT, "v2_block_n": 32, "v2_block_k_fp8": 1024, "v2_num_warps": 8},
    "v2_n8_k2048_w8": {**FLAT, "v2_block_n": 8, "v2_block_k_fp8": 2048, "v2_block_k_fp4": 1024, "v2_num_warps": 8},
    "v2_n8_k1024_w8_p528": {**FLAT, "v2_block_n": 8, "v2_block_k_fp8": 1024, "v2_block_k_fp4": 512,
                            "v2_num_warps": 8, "v2_programs": 528},
    "v2_n16_k1024_w8_p528": {**FLAT, "v2_block_k_fp8": 1024, "v2_num_warps": 8, "v2_programs": 528},
    "v2_nosplit": {**FLAT, "v2_split_k": 1},
    "v2_fused_sum": {**FLAT, "v2_fused_sum": True},  # the split sum in the GEMV's launch: v2_flat's bits
    "v2_fused_sum_programs528": {**FLAT, "v2_fused_sum": True, "v2_programs": 528},
    # session 17: the tile loop unrolled (v2_unroll: the same products in the same order, the twin's bits), splits
    # enough that each program reads one or two tiles, and wider row blocks (x's bf16 -> fp32 shared by 2-4 rows a
    # thread)
    "v2_unroll": {"kernel": "v2", "v2_unroll": True},
    "v2_flat_unroll": {**FLAT, "v2_unroll": True},
    "v2_k1024_unroll": {**FLAT, "v2_block_k_fp8": 1024, "v2_unroll": True},
    "v2_k1024_p2048": {**FLAT, "v2_block_k_fp8": 1024, "v2_programs": 2048},
    "v2_k1024_p4096": {**FLAT, "v2_block_k_fp8": 1024, "v2_programs": 4096},
    "v2_k512_p2048": {**FLAT, "v2_programs": 2048},
    "v2_k512_p4096": {**FLAT, "v2_programs": 4096},
    "v2_n32_k512_p2048": {**FLAT, "v2_block_n": 32, "v2_programs": 2048},
    "v2_n32_k1024_p2048": {**FLAT, "v2_block_n": 32, "v2_block_k_fp8": 1024, "v2_programs": 2048},
    "v2_n64_k512_p2048": {**FLAT, "v2_block_n": 64, "v2_programs": 2048},
    "v2_n32_k1024_w8_p2048": {**FLAT, "v2_block_n": 32, "v2_block_k_fp8": 1024, "v2_num_warps": 8,
                              "v2_programs": 2048},
    "v2_n32_k1024_unroll": {**FLAT, "v2_block_n": 32, "v2_block_k_fp8": 1024, "v2_unroll": True},
    # session 39 call 2 measured mini's wo_a at 12.0 us (13.3 at the defaults) with 8-row blocks of 1,024 inputs or
    # 32-row blocks of 512, no split, through Triton's cp.async stages (removed); these are those tiles with the
    # unrolled loop instead (other bits than the defaults')
    "v2_n8_k1024_s1_unroll": {**FLAT, "v2_block_n": 8, "v2_block_k_fp8": 1024, "v2_split_k": 1, "v2_unroll": True},
    "v2_n32_k512_s1_unroll": {**FLAT, "v2_block_n": 32, "v2_split_k": 1, "v2_unroll": True},
    "v2_n8_k1024_s1_w8_unroll": {**FLAT, "v2_block_n": 8, "v2_block_k_fp8": 1024, "v2_split_k": 1, "v2_num_warps": 8,
                                 "v2_unroll": True},
    "v2_n32_k512_s2_unroll": {**FLAT, "v2_block_n": 32, "v2_split_k": 2, "v2_unroll": True},
}
TWINS = {"v2_fused_sum": "v2_flat", "v2_fused_sum_programs528": "v2_programs528",  # variant -> same bits as
         "v2_unroll": "v2_default", "v2_flat_unroll": "v2_flat", "v2_k1024_unroll": "v2_k1024"}
ROWS_VARIANTS = {  # --rows: a batched step's rows on one weight, a program per row or v2_rows per program
    "v2_rows1": {"kernel": "v2", "v2_rows": 1},
    "v2_rows8": {"kernel": "v2", "v2_rows": 8},
    "v2_rows16": {"kernel": "v2", "v2_rows": 16},
    "v3_default": {"kernel": "v3"},  # tensor-core tiles of 16 rows (qgemv v3)
    "v3_n16": {"kernel": "v3", "v3_block_n": 16},
    "v3_n64_k128": {"kernel": "v3", "v3_block_n": 64, "v3_block_k_fp8": 128},
    "v3_programs528": {"kernel": "v3", "v2_programs": 528},
    "v3_nosplit": {"kernel": "v3", "v2_split_k": 1},
    # bits_as_v3_default: whether an arm keeps v3's bits. Session 24 call 5 (one Flash layer, rows 1 / 16): 8 warps
    # 87.9 / 92.4 us against the default's 57.9 / 62.5 (the same bits); 64 outputs a program 49.6 / 63.2 us, other
    # bits in 3 of 8 shapes (fewer N blocks, more K splits); Triton's pipeline stages 2-4 changed nothing (57.9-58.5).
    # Session 25 call 1: the FP8 loop unrolled (same bits) 55.7 / 60.9 against 56.3 / 60.7: removed.
    # Session 25 (the same bits, removed): P programs walking the N blocks 58.7 / 58.9 us (128 of them, call 3); a
    # program's K chunk one tile 67.4 / 71.3 (call 4; with 8 warps 111.4 / 114.9), against v3's 55.5 / 59.7.
    # Session 26 call 1 (removed): the operands swapped (the weight the MMA's A operand, other bits) 55.2 / 60.1 us,
    # with 132 programs 52.5 / 56.6, 128-output blocks 55.5 / 64.4, against v3's 54.2 / 59.2.
    "v3_w8": {"kernel": "v3", "v3_num_warps": 8},
    "v3_n64": {"kernel": "v3", "v3_block_n": 64},
    # Session 27: the mma family (dsv4.kernels.qgemv_mma: the FP8 weights the A operand of m16n8k16 products, up to
    # 8 rows their columns); "mma" holds qgemv_mma.CONFIG's overrides (tiles a program, warps, pieces a step, the
    # split's programs). Other bits than v2's and v3's.
    "mma_default": {"kernel": "mma", "mma": {}},
    "mma_u2": {"kernel": "mma", "mma": {"u": 2}},
    "mma_u8": {"kernel": "mma", "mma": {"u": 8}},
    "mma_w8": {"kernel": "mma", "mma": {"warps": 8}},
    "mma_p528": {"kernel": "mma", "mma": {"programs": 528}},
    "mma_p132": {"kernel": "mma", "mma": {"programs": 132}},
}
MOE_VARIANTS = {  # fused_moe.CONFIG overrides
    "fused_default": {},
    "fused_n8": {"gate_up_block_n": 8, "down_block_n": 8},
    "fused_n32_w8": {"gate_up_block_n": 32, "down_block_n": 32, "num_warps": 8},
    "fused_k512": {"block_k_fp4": 512},
    "fused_shared_n8_k1024": {"shared_block_n": 8, "block_k_fp8": 1024},
    "fused_shared_n2": {"shared_block_n": 2},
}
L2_DEFEAT = 256 << 20
DEVICE = "cuda"  # tests/test_qgemv.py runs the bookkeeping on CPU through the interpreter
TOLERANCE = 2 ** -6  # max_rel_err above this (bf16 chains agree far closer) marks an arm wrong




def timed(fn, calls: int, reps: int = 10) -> float:
    """Median microseconds per call of fn(i), i = 0..calls-1 captured in one CUDA graph (each call run eagerly once
    first: a kernel's first launch on a weight may read the host, e.g. qgemv_mma's scale range)."""
    for i in range(calls):
        fn(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(i)
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / calls)
    return statistics.median(times)


def digest(tensors) -> str:
    """sha256 (16 hex digits) of the tensors' bytes: equal across processes where the bits are equal."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def launches(fn) -> int | None:
    """Kernels one call of fn launches (memcpy/memset not counted); None off CUDA."""
    if DEVICE != "cuda":
        return None
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(not (n.startswith("Memcpy") or n.startswith("Memset")) for n in names)


def bandwidth() -> float:
    src = torch.empty(2 << 30, dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    walls = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        walls.append(a.elapsed_time(b) / 1000)
    return 2 * src.numel() / statistics.median(walls)


def scales(*shape) -> torch.Tensor:
    """ue8m0 scales near 2**-7 (stored bytes 118..122), so products stay in a bf16-friendly range."""
    return torch.randint(118, 123, shape, dtype=torch.uint8, device=DEVICE).view(torch.float8_e8m0fnu)


def random_weight(fmt: str, n: int, k: int, lead: tuple = ()) -> QWeight:
    """Random stored bytes in the official layouts (any byte is an e2m1 pair; e4m3 from a normal sample)."""
    if fmt == "fp4":
        data = torch.randint(0, 256, (*lead, n, k // 2), dtype=torch.uint8, device=DEVICE).view(torch.int8)
        return QWeight(data, scales(*lead, n, k // 32), "fp4")
    if fmt == "fp8":
        data = (torch.randn(*lead, n, k, device=DEVICE) * 64).to(torch.float8_e4m3fn)
        return QWeight(data, scales(*lead, math.ceil(n / 128), math.ceil(k / 128)), "fp8")
    return QWeight(torch.randn(*lead, n, k, device=DEVICE, dtype=torch.bfloat16) * 0.02)


def gemv_pairs(overrides: dict) -> tuple:
    """configured's pairs for a qgemv variant: qgemv.CONFIG's overrides, and qgemv_mma.CONFIG's under "mma"."""
    return (qgemv.CONFIG, {k: v for k, v in overrides.items() if k != "mma"}), (qgemv_mma.CONFIG,
                                                                              overrides.get("mma", {}))


@contextlib.contextmanager
def configured(mode: str | None, *pairs):
    """Within: each (CONFIG dict, overrides) pair applied, and DSV4_KERNELS=mode unless None."""
    saved, env = [(c, dict(c)) for c, _ in pairs], os.environ.get("DSV4_KERNELS")
    for config, overrides in pairs:
        config.update(overrides)
    if mode is not None:
        os.environ["DSV4_KERNELS"] = mode
    try:
        yield
    finally:
        for config, old in saved:
            config.clear()
            config.update(old)
        if env is None:
            os.environ.pop("DSV4_KERNELS", None)
        else:
            os.environ["DSV4_KERNELS"] = env


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.float(), ref.float()
    return float((got - ref).abs().max() / ref.abs().max())


class Runner:
    def __init__(self, bw: float, arms: re.Pattern):
        self.bw, self.arms = bw, arms
        self.times: dict[str, dict[str, float]] = {}  # shape -> variant -> us (arms within TOLERANCE)
        self.bytes: dict[str, int] = {}

    def arm(self, shape: str, variant: str, fn, ref: torch.Tensor | None, nbytes: int, calls: int, context,
            twin=None, **info):
        """Check fn(0) against ref (and bit for bit against twin(), if given), then time it; a variant that fails
        to compile or run is reported, not fatal."""
        if not self.arms.search(variant):
            return
        try:
            with context():
                out = fn(0)
                err = rel_err(out, ref) if ref is not None else 0.0
                if twin is not None:
                    info["bit_equal"] = torch.equal(out, twin())
                info["launches"] = launches(lambda: fn(0))
                us = timed(fn, calls)
        except Exception as e:  # noqa: BLE001
            emit("QGEMV", shape=shape, variant=variant, error=f"{type(e).__name__}: {str(e)[:300]}")
            return
        self.bytes[shape] = nbytes
        if err <= TOLERANCE:
            self.times.setdefault(shape, {})[variant] = us
        emit("QGEMV", shape=shape, variant=variant, us=round(us, 2), bytes=nbytes, gb_s=round(nbytes / us / 1e3, 1),
             fraction=round(nbytes / (us * 1e-6) / self.bw, 3), max_rel_err=err, calls=calls, pdl=kernels.PDL,
             **info)


def dense_shapes(cfg, w: int):
    D = cfg.hidden_size
    heads, groups, hd = cfg.num_attention_heads // w, cfg.o_groups // w, cfg.head_dim
    I = cfg.moe_intermediate_size
    return [  # name, fmt, N, K, kind (grouped: K is a group's width)
        ("wq_a", "fp8", cfg.q_lora_rank, D, "linear"),
        ("wq_b", "fp8", heads * hd, cfg.q_lora_rank, "linear"),
        ("wkv", "fp8", hd, D, "linear"),
        ("wo_a", "fp8", groups * cfg.o_lora_rank, heads * hd // groups, "grouped"),
        ("wo_b", "fp8", D, cfg.o_groups * cfg.o_lora_rank // w, "linear"),
        ("indexer.wq_b", "fp8", cfg.index_n_heads * cfg.index_head_dim, cfg.q_lora_rank, "linear"),
        ("shared.w1", "fp8", I // w, D, "linear"),
        ("shared.w3", "fp8", I // w, D, "linear"),
        ("shared.w2", "fp8", D, I // w, "linear"),
        ("compressor.wkv (CSA)", "bf16", 2 * hd, D, "linear"),
        ("compressor.wgate (CSA)", "bf16", 2 * hd, D, "linear"),
        ("indexer.compressor.wkv", "bf16", 2 * cfg.index_head_dim, D, "linear"),
        ("indexer.weights_proj", "bf16", cfg.index_n_heads, D, "linear"),
        ("gate (router)", "bf16", cfg.n_routed_experts, D, "linear"),
    ]


def l2_defeating_weights(fmt: str, n: int, k: int):
    """Enough distinct copies of one random weight that calls cycling through them read HBM, not L2:
    (weights, bytes of one, copies, calls)."""
    one = random_weight(fmt, n, k)
    copies = max(1, math.ceil(L2_DEFEAT / one.nbytes))
    weights = [one] + [random_weight(fmt, n, k) for _ in range(copies - 1)]
    return weights, one.nbytes, copies, max(50, copies)


def bench_dense(run: Runner, cfg, w: int, shapes: re.Pattern):
    groups = cfg.o_groups // w
    for name, fmt, n, k, kind in dense_shapes(cfg, w):
        if not shapes.search(name):
            continue
        weights, nbytes, copies, calls = l2_defeating_weights(fmt, n, k)
        gx = groups if kind == "grouped" else 1
        x = torch.randn(1, k * gx, device=DEVICE, dtype=torch.bfloat16)
        info = dict(fmt=fmt, N=n, K=k, kind=kind, copies=copies)

        def ref(i):
            wt = weights[i % copies].dequant(torch.bfloat16)
            if kind == "grouped":
                return torch.einsum("tgi,goi->tgo", x.view(1, gx, -1), wt.view(gx, n // gx, -1)).flatten(1)
            return F.linear(x, wt)

        expected = ref(0)
        run.arm(name, "torch_dequant_gemm" if fmt != "bf16" else "torch_linear", ref, expected, nbytes, calls,
                contextlib.nullcontext, **info)
        if fmt == "bf16":
            continue
        for variant, overrides in QGEMV_VARIANTS.items():
            def fused(i):
                if kind == "grouped":
                    return qgemv.grouped_linear(x, weights[i % copies], gx)
                return qgemv.linear(x, weights[i % copies])

            twin = None
            if variant in TWINS:
                def twin(f=fused, o=QGEMV_VARIANTS[TWINS[variant]]):
                    with configured(None, (qgemv.CONFIG, o)):
                        return f(0)
            run.arm(name, variant, fused, expected, nbytes, calls,
                    lambda o=overrides: configured(None, (qgemv.CONFIG, o)), twin=twin, **info)
        del weights


def bench_moe(run: Runner, cfg, w: int):
    """Routed experts of one decode token on rank 0: 6 of 256 selected, 3 of them local (of 256 / w stacked; w 1: 6),
    a different local triple per call; and the rank's shared-expert slice."""
    D, I, k = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts_per_tok
    n_local = cfg.n_routed_experts // w
    stacks = {"w1": random_weight("fp4", I, D, (n_local,)), "w3": random_weight("fp4", I, D, (n_local,)),
              "w2": random_weight("fp4", D, I, (n_local,))}
    per_expert = sum(s.data[0].nbytes + s.scale[0].nbytes for s in stacks.values())
    local = k if w == 1 else k // 2  # one rank holds every expert
    gen = torch.Generator().manual_seed(0)
    routes = []
    for _ in range(max(50, math.ceil(L2_DEFEAT / (per_expert * local)))):
        mine = torch.randperm(n_local, generator=gen)[:local]
        theirs = n_local + torch.randperm(cfg.n_routed_experts - n_local, generator=gen)[:k - local]
        routes.append(torch.cat([mine, theirs]).sort().values.view(1, k).to(DEVICE))
    calls = len(routes)
    weights = torch.softmax(torch.randn(1, k), -1).to(DEVICE, torch.bfloat16)
    x = torch.randn(1, D, device=DEVICE, dtype=torch.bfloat16)
    limit = cfg.swiglu_limit
    info = dict(fmt="fp4", N=I, K=D, kind="moe", local_experts=local, launches_fused=2)

    def routed(i):
        return moe_mod.routed(x, routes[i % calls], weights, stacks, 0, cfg)

    with configured("torch"):
        expected = routed(0)
    nbytes = per_expert * local
    # The reference gathers and dequantises 18 matrices per call, ~1 GB the graph's pool keeps per call: few calls.
    run.arm("experts.routed", "torch_dequant_gemm", routed, expected, nbytes, 8, lambda: configured("torch"), **info)
    for variant in ("v1_default", "v2_default"):  # the GPU-checked path: all 6 selected experts, 3 + act + sum
        run.arm("experts.routed", "qgemv_" + variant, routed, expected, nbytes, calls,
                lambda v=variant: configured("auto", (qgemv.CONFIG, QGEMV_VARIANTS[v])), **info)
    for variant, overrides in MOE_VARIANTS.items():
        run.arm("experts.routed", variant, routed, expected, nbytes, calls,
                lambda o=overrides: configured("triton", (fused_moe.CONFIG, o)), **info)

    shared = {name: random_weight("fp8", n, kk) for name, n, kk in (("w1", I // w, D), ("w3", I // w, D),
                                                                   ("w2", D, I // w))}
    s_bytes = sum(s.nbytes for s in shared.values())

    def shared_expert(i):
        return moe_mod.shared_expert(x, shared, limit)

    with configured("torch"):
        s_expected = shared_expert(0)
    s_info = dict(fmt="fp8", N=I // w, K=D, kind="shared", launches_fused=2)
    run.arm("experts.shared", "torch_dequant_gemm", shared_expert, s_expected, s_bytes, 50,
            lambda: configured("torch"), **s_info)
    for variant in ("v1_default", "v2_default"):  # gate/up/w2 linears and the activation's torch ops
        run.arm("experts.shared", "qgemv_" + variant, shared_expert, s_expected, s_bytes, 50,
                lambda v=variant: configured("auto", (qgemv.CONFIG, QGEMV_VARIANTS[v])), **s_info)
        for mv in ("fused_default", "fused_shared_n8_k1024", "fused_shared_n2"):  # kernel 1, then the w2 linear
            run.arm("experts.shared", f"{mv}+{variant}_w2", shared_expert, s_expected, s_bytes, 50,
                    lambda o=MOE_VARIANTS[mv], v=variant: configured(
                        "triton", (fused_moe.CONFIG, o), (qgemv.CONFIG, QGEMV_VARIANTS[v])), **s_info)


def bench_rows(run: Runner, cfg, w: int, rows_list):
    """A batched decode step's rows on each FP8 linear of one layer (attention's, the shared expert's: rows that
    share the weight), per row count and ROWS_VARIANTS arm. Shape names carry the rows ("wq_a x16"); rows_exact:
    every row equals that row launched alone under the same arm (for v2: one row per program), bit for bit."""
    groups = cfg.o_groups // w
    for name, fmt, n, k, kind in dense_shapes(cfg, w):
        if fmt == "bf16":
            continue
        weights, nbytes, copies, calls = l2_defeating_weights(fmt, n, k)
        one = weights[0]  # rows_exact is checked on the first copy
        gx = groups if kind == "grouped" else 1

        def product(x, wt):
            return qgemv.grouped_linear(x, wt, gx) if kind == "grouped" else qgemv.linear(x, wt)

        for rows in rows_list:
            x = torch.randn(rows, k * gx, device=DEVICE, dtype=torch.bfloat16)
            wt = one.dequant(torch.bfloat16)
            if kind == "grouped":
                expected = torch.einsum("tgi,goi->tgo", x.view(rows, gx, -1), wt.view(gx, n // gx, -1)).flatten(1)
            else:
                expected = F.linear(x, wt)
            info = dict(fmt=fmt, N=n, K=k, kind=kind, copies=copies, rows=rows)
            with configured(None, (qgemv.CONFIG, ROWS_VARIANTS["v3_default"])):
                v3_out = product(x, one)
            for variant, overrides in ROWS_VARIANTS.items():
                def context(o=overrides):
                    return configured(None, *gemv_pairs(o))
                if not run.arms.search(variant):
                    continue
                try:
                    with context():
                        alone = torch.cat([product(x[r:r + 1], one) for r in range(rows)])
                        out = product(x, one)
                        exact = torch.equal(out, alone)
                except Exception as e:  # noqa: BLE001 (a variant that fails to compile is reported, not fatal)
                    emit("QGEMV", shape=f"{name} x{rows}", variant=variant, error=f"{type(e).__name__}: {e}"[:300])
                    continue
                run.arm(f"{name} x{rows}", variant, lambda i, x=x: product(x, weights[i % copies]), expected, nbytes,
                        calls, context, rows_exact=exact, bits_as_v3_default=torch.equal(out, v3_out), **info)
        del weights


def summarise_rows(run: Runner, cfg, w: int, rows_list):
    """QGEMV_ROWS per rows and arm: one layer's FP8 linears (attention's and the shared expert's), each once."""
    names = [name for name, fmt, *_ in dense_shapes(cfg, w) if fmt != "bf16"]
    for rows in rows_list:
        for variant in ROWS_VARIANTS:
            arms = [run.times.get(f"{name} x{rows}", {}).get(variant) for name in names]
            if None in arms:
                continue
            nbytes = sum(run.bytes[f"{name} x{rows}"] for name in names)
            us = sum(arms)
            emit("QGEMV_ROWS", rows=rows, variant=variant, us=round(us, 1), layer_bytes=nbytes,
                 fraction=round(nbytes / (us * 1e-6) / run.bw, 3), world=w,
                 scope="one layer on rank 0, a batched decode step: attention's and the shared expert's FP8 linears")


ATTENTION = ("wq_a", "wq_b", "wkv", "wo_a", "wo_b", "indexer.wq_b")
SHARED = ("shared.w1", "shared.w3", "shared.w2")


def summarise(run: Runner, w: int):
    """QGEMV_BEST per shape; QGEMV_LAYER per qgemv variant: attention's quantised linears plus the MoE
    (routed + shared) unfused with that variant, and fused (best fused arms, w2 with that variant)."""
    for shape, arms in run.times.items():
        best = min(arms, key=arms.get)
        emit("QGEMV_BEST", shape=shape, variant=best, us=round(arms[best], 2),
             fraction=round(run.bytes[shape] / (arms[best] * 1e-6) / run.bw, 3))
    t = run.times
    for variant in QGEMV_VARIANTS:
        if not all(variant in t.get(s, {}) for s in ATTENTION + SHARED):
            continue
        attention = sum(t[s][variant] for s in ATTENTION)
        rec = {"variant": variant, "attention_us": round(attention, 1), "world": w}
        moe_bytes = run.bytes.get("experts.routed", 0) + run.bytes.get("experts.shared", 0)
        nbytes = sum(run.bytes[s] for s in ATTENTION) + moe_bytes
        unfused = t.get("experts.routed", {}).get("qgemv_" + variant)
        if unfused is not None:
            rec["moe_unfused_us"] = round(unfused + sum(t[s][variant] for s in SHARED), 1)
        fused_routed = [us for v, us in t.get("experts.routed", {}).items() if v in MOE_VARIANTS]
        fused_shared = [us for v, us in t.get("experts.shared", {}).items() if v.endswith(f"+{variant}_w2")]
        if fused_routed and fused_shared:
            rec["moe_fused_us"] = round(min(fused_routed) + min(fused_shared), 1)
        for key in ("moe_unfused_us", "moe_fused_us"):
            if key in rec:
                us = attention + rec[key]
                rec[key.replace("_us", "_layer_fraction")] = round(nbytes / (us * 1e-6) / run.bw, 3)
        rec["layer_bytes"] = nbytes
        emit("QGEMV_LAYER", scope="one layer on rank 0 at decode (1 row): attention's FP8 linears once each, "
             "3 local routed FP4 experts, the shared-expert slice", **rec)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--arms", default=".", help="regex over variant names (e.g. 'torch|default')")
    ap.add_argument("--shapes", default="", help="regex over the dense shapes' names: only those, no MoE part")
    ap.add_argument("--rows", default="", help="row counts (e.g. 1,4,16,32): only the batched-step arms (ROWS_VARIANTS)")
    args = ap.parse_args()
    cfg, w = preset("flash"), args.world
    bw = bandwidth()
    emit("BANDWIDTH", bytes_per_s=bw, device=torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE,
          scope="d2d copy of 2 GiB, read+written")
    run = Runner(bw, re.compile(args.arms))
    if args.rows:
        rows_list = [int(r) for r in args.rows.split(",")]
        bench_rows(run, cfg, w, rows_list)
        summarise_rows(run, cfg, w, rows_list)
        return
    bench_dense(run, cfg, w, re.compile(args.shapes or "."))
    if not args.shapes:
        bench_moe(run, cfg, w)
    summarise(run, w)


if __name__ == "__main__":
    main()
