"""Compile every kernel variant the model launches for an H100/H200 (sm_90) without a GPU.

Run as a script without TRITON_INTERPRET (tests/test_kernels.py does): the interpreter accepts
Python that the GPU compiler refuses (a plain helper function, a loop variable changing type), so
CPU tests alone would not catch it. Each wrapper is called with CPU tensors; the patched launcher
compiles the launch's signature to PTX and cubin for sm_90 instead of running it.

With DSV4_PDL=1 (read at import, so its own process: tests/test_kernels.py runs both) every variant compiles with
programmatic dependent launch and its PTX is checked (check_pdl): every kernel is launched with launch_pdl (the launcher's with_pdl, which compile_only keeps), and has
griddepcontrol.wait before every global access but the loads of the weights the kernel may read early (EARLY; a
variant that streams a stored weight must load it before the wait), and the release only after the wait.
"""

import importlib
import os
import pkgutil
import re
import sys
import time

import torch

assert os.environ.get("TRITON_INTERPRET", "0") != "1", "compile checks need the compiler, not the interpreter"

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from dsv4.config import preset  # noqa: E402
from dsv4 import kernels  # noqa: E402
from dsv4.kernels import attention, bookkeeping, commit, commit_step, compressor, dense, dequant, door, draw, expert_groups, gate_route, geometry, gumbel, hc, hc_boundary, hc_head, hc_post, moe, moe_gl, moe_tc, norm, normrope, prefill_attention, prefill_moe, qgemv, qgemv_mma, rope, rope_table, route, sample, topk, undo  # noqa: E402
from dsv4.model.rope import Rope  # noqa: E402
from dsv4.model.step import PoolStep, Step  # noqa: E402
from dsv4.formats import QWeight  # noqa: E402
from dsv4.model.commit import Write  # noqa: E402

TYPES = {torch.float32: "fp32", torch.float64: "fp64", torch.bfloat16: "bf16", torch.float16: "fp16", torch.uint8: "u8", torch.int8: "i8",
         torch.int64: "i64", torch.int32: "i32", torch.float8_e4m3fn: "fp8e4nv", torch.bool: "i1"}
compiled: set = set()
pending: list = []  # (key, source, options) of each variant, in launch order
# DSV4_COMPILE_SWEEPS=1 (tests/test_kernels.py's slow test) adds the tiles the benchmarks sweep and compiles every
# variant recorded; without it (CI) every variant the model launches by default or under a DSV4_* switch is recorded
# (but moe_tc's other orders, its bf16_decode's other side and its fp32 tiles: the slow set since session 37) and
# one of each class compiles (_one_of_each_class, since session 38: each kernel's flags and options, not each size or
# argument type; DSV4_COMPILE_ALL=1 compiles every recorded variant). CI's 15 minutes; DSV4_COMPILE_TIMES=1 says
# where the minutes go.
SWEEPS = os.environ.get("DSV4_COMPILE_SWEEPS", "0") == "1"
# DSV4_COMPILE_DIGEST=1: a line `SASS kernel key options digest` a variant, the digest of its SASS (sass_digest): a
# refactor's kernels proven unchanged by the same lines before and after.
DIGEST = os.environ.get("DSV4_COMPILE_DIGEST", "0") == "1"
# DSV4_COMPILE_TIMES=1: a line `COMPILE_S kernel seconds` a variant (where the check's minutes go).
TIMES = os.environ.get("DSV4_COMPILE_TIMES", "0") == "1"
PDL = kernels.PDL
pdl_variants: set = set()  # (kernel, launch_pdl) compiled under PDL
# The pointer arguments a kernel launched with launch_pdl may load from before its wait: stored weights
EARLY = {"_qgemv2_kernel": {"w_ptr", "s_ptr"}, "_dense_kernel": {"w_ptr"}, "_qgemv3_kernel": {"w_ptr", "s_ptr"},
         "_dense3_kernel": {"w_ptr"},
         "_gate_up_shared_kernel": {"sw1_ptr", "ss1_ptr", "sw3_ptr", "ss3_ptr"},
         "_gate_up_shared_gl_kernel": {"sw1_ptr", "ss1_ptr", "sw3_ptr", "ss3_ptr"},
         "_qgemv_mma_kernel": {"w_ptr", "s_ptr"},
         "_boundary_kernel": {"fn_ptr", "base_ptr", "scale_ptr", "norm_w_ptr"}, "_route_kernel": {"bias_ptr"},
         "_gate_route_kernel": {"w_ptr", "bias_ptr"}}
# A variant compiled with the constant EARLY = 1 of a kernel here may read these before its wait too: what the caller
# says was written two or more kernels back (each kernel releases the next only after its own wait, so the kernel
# two back is complete when this one starts). Checked as "<kernel>:behind".
BEHIND = {"_pool_kernel": {"kv_ptr", "gate_ptr", "ring_kv_ptr", "ring_gate_ptr", "ape_ptr", "norm_ptr", "cur_ptr",
                           "prev_ptr", "live_ptr", "cos_ptr", "sin_ptr", "ids_ptr"},
          "_pool_pair_kernel": {"kv_ptr", "gate_ptr", "ring_kv_ptr", "ring_gate_ptr", "ape_ptr", "norm_ptr", "kv2_ptr",
                                "gate2_ptr", "ring_kv2_ptr", "ring_gate2_ptr", "ape2_ptr", "norm2_ptr", "cur_ptr",
                                "prev_ptr", "live_ptr", "cos_ptr", "sin_ptr", "ids_ptr"},
          "_index_keys_kernel": {"q_ptr", "wts_ptr", "cos_ptr", "sin_ptr", "icomp_ptr", "committed_ptr", "visible_ptr",
                                 "ids_ptr"},
          "_gate_up_shared_gl_kernel": {"x_ptr", "sw1_ptr", "ss1_ptr", "sw3_ptr", "ss3_ptr"},
          "_down_gl_kernel": {"h_ptr", "w_ptr", "s_ptr", "ids_ptr", "wt_ptr"}}
EARLY.update({f"{name}:behind": pointers for name, pointers in BEHIND.items()})
# A variant compiled with PREFETCH = 1 of a kernel here (moe_gl CONFIG down_prefetch: the kernel before released it
# first of all, so only what three or more launches back wrote is complete when it starts) may load these before its
# wait (its L2 prefetches load nothing). Checked as "<kernel>:prefetch".
PREFETCHING = {"_down_gl_kernel": {"ids_ptr", "w_ptr", "s_ptr"}}
EARLY.update({f"{name}:prefetch": pointers for name, pointers in PREFETCHING.items()})
# Kernels whose variant compiled with RELEASE = 1 releases the next kernel before its wait (qgemv.linear's release,
# pdl_release): checked as "<kernel>:release", the release's place not held to the wait, all else as the kernel's.
RELEASING = {"_qgemv2_kernel"}
EARLY.update({f"{name}:release": EARLY[name] for name in RELEASING})


def aligned(a) -> bool:
    """Whether Triton's launcher would mark this argument 16-divisible, as it does on a GPU (what lets it
    emit 16-byte loads): a pointer 16-byte aligned, an integer a multiple of 16."""
    if isinstance(a, torch.Tensor):
        return a.data_ptr() % 16 == 0
    return isinstance(a, int) and not isinstance(a, bool) and a % 16 == 0


def compile_only(fn, t):
    return kernels.with_pdl(_recorder(triton.jit(fn, do_not_specialize=getattr(fn, "do_not_specialize", None)), fn.__name__, ASTSource))


def _recorder(jit, kernel_name: str, source):
    """A launcher that records the launch's specialisation (its signature, constants and options) in `pending`, to
    be compiled for sm_90 by compile_pending: as Triton's launcher specialises it on a GPU (an integer 1 a constant,
    16-byte aligned pointers and multiples of 16 marked divisible; neither for the kernel's do_not_specialize)."""
    class Launch:
        def __getitem__(self, grid):
            def run(*args, **constexprs):
                options = {k: constexprs.pop(k) for k in ("num_warps", "num_stages", "launch_pdl", "maxnreg")
                           if k in constexprs}
                if PDL:
                    pdl_variants.add((kernel_name, options.get("launch_pdl", False)))
                names = jit.arg_names
                sig, key, attrs = {}, [], {}
                for i, (name, a) in enumerate(zip(names, args)):
                    if type(a) is int and a == 1 and name not in jit.do_not_specialize:  # the launcher's constant 1
                        constexprs[name] = 1
                        continue
                    sig[name] = "*" + TYPES[a.dtype] if isinstance(a, torch.Tensor) else (
                        "fp32" if isinstance(a, float) else "i32")
                    key.append(sig[name])
                    if aligned(a) and name not in jit.do_not_specialize:
                        attrs[(i,)] = [["tt.divisibility", 16]]
                        key.append("D")
                for name in [n for n, v in constexprs.items() if isinstance(v, torch.Tensor)]:  # a pointer by name
                    a = constexprs.pop(name)
                    sig[name] = "*" + TYPES[a.dtype]
                    key.append((name, sig[name]))
                    if aligned(a):
                        attrs[(names.index(name),)] = [["tt.divisibility", 16]]
                for p in jit.params[len(args):]:  # a constant left to its default: the default, as a launch takes it
                    if p.name not in constexprs and p.name not in sig and p.has_default:
                        constexprs[p.name] = p.default
                for name, v in constexprs.items():
                    sig[name] = "constexpr"
                    key.append((name, v))
                sig = {n: sig[n] for n in names if n in sig}  # the kernel's parameter order
                behind = kernel_name in BEHIND and constexprs.get("EARLY", 0) == 1
                prefetching = kernel_name in PREFETCHING and constexprs.get("PREFETCH", 0) == 1
                releasing = kernel_name in RELEASING and constexprs.get("RELEASE", 0) == 1
                k = (kernel_name + ":behind" * behind + ":prefetch" * prefetching + ":release" * releasing, tuple(key),
                     tuple(sorted(options.items())))
                if k in compiled:
                    return
                src = source(fn=jit, signature=sig, constexprs={(names.index(n),): v for n, v in constexprs.items()},
                             attrs=attrs)
                compiled.add(k)
                params = [(n, sig[n]) for n in names if n in sig and sig[n] != "constexpr"]  # the PTX's, in order
                # a variant that may stream a stored weight before its wait must (the point of the early launch)
                early = behind or prefetching or (kernel_name in EARLY and constexprs.get("EARLY", True)
                                                  and not constexprs.get("HASH", False))
                pending.append((k, src, options, params, early))  # compiled at the end, on every core (compile_pending)
            return run
    return Launch()


# every module of dsv4.kernels: a new kernel module is held to the check below without being listed here
KERNEL_MODULES = [importlib.import_module(f"dsv4.kernels.{m.name}") for m in pkgutil.iter_modules(kernels.__path__)]
for module in KERNEL_MODULES:
    module.launcher = compile_only

def qgemv_variants(dtype, scale_dtype):
    fp8 = QWeight(torch.zeros(1024, 4096, dtype=torch.float8_e4m3fn), torch.zeros(8, 32, dtype=scale_dtype), "fp8")
    qgemv.linear(torch.zeros(1, 4096, dtype=dtype), fp8)
    qgemv.grouped_linear(torch.zeros(1, 8 * 512, dtype=dtype),
                         QWeight(torch.zeros(8 * 128, 512, dtype=torch.float8_e4m3fn),
                                 torch.zeros(8, 4, dtype=scale_dtype), "fp8"), 8)
    fp4 = QWeight(torch.zeros(4, 2048, 2048, dtype=torch.int8), torch.zeros(4, 2048, 128, dtype=scale_dtype), "fp4")
    ids = torch.zeros(6, dtype=torch.int64)
    qgemv.expert_linear(torch.zeros(1, 4096, dtype=dtype), fp4, ids, 6)
    fp8s = QWeight(torch.zeros(4, 2048, 4096, dtype=torch.float8_e4m3fn), torch.zeros(4, 16, 32, dtype=scale_dtype),
                   "fp8")
    qgemv.expert_linear(torch.zeros(1, 4096, dtype=dtype), fp8s, ids, 6)
    # CONFIG v2_early_tiles (DSV4_QGEMV_EARLY_TILES): wo_b's and wo_a's 8-row blocks with 2, 4 and 8 tiles before the
    # wait (the whole K of wo_b at 8)
    was = qgemv.CONFIG["v2_early_tiles"]
    for pre in (2, 4, 8):
        qgemv.CONFIG["v2_early_tiles"] = pre
        for n, k in ((4096, 8192), (8192, 4096)):
            w = QWeight(torch.zeros(n, k, dtype=torch.float8_e4m3fn),
                        torch.zeros(n // 128, k // 128, dtype=scale_dtype), "fp8")
            qgemv.linear(torch.zeros(1, k, dtype=dtype), w)
    qgemv.CONFIG["v2_early_tiles"] = was
    # linear's release (moe_gl CONFIG down_prefetch: the shared expert's down linear releases kernel 2 first of all)
    for n, k in ((4096, 2048), (1024, 4096)):
        qgemv.linear(torch.zeros(1, k, dtype=dtype), QWeight(torch.zeros(n, k, dtype=torch.float8_e4m3fn),
                                                             torch.zeros(n // 128, k // 128, dtype=scale_dtype), "fp8"),
                     release=True)


for blocks in (False, True):  # a batched step's pairs by expert (P_PAD 32, 256, 512), both forms
    expert_groups.CONFIG["blocks"] = blocks
    for pairs in ((2, 6), (32, 6), (64, 6)):
        expert_groups.groups(torch.zeros(pairs, dtype=torch.int64))
expert_groups.CONFIG["blocks"] = False
rope_table.tables(torch.zeros(3, dtype=torch.int64), torch.zeros(2, 32))  # a step's "main" and "compress"
rope_table.tables(torch.zeros(3), torch.zeros(1, 32))  # the windows' fp32 starts
# a step's bookkeeping: Comm's begin / end (with and without the last door's unseen flag) and one state's settle
i64 = dict(dtype=torch.int64)
bookkeeping.begin(torch.zeros(43, 2, **i64), torch.zeros(43, 2), torch.zeros(()))
for unseen in (None, torch.zeros((), dtype=torch.bfloat16)):
    bookkeeping.end(torch.zeros(43, 2, **i64), torch.zeros((), **i64), torch.zeros(3, **i64), torch.zeros(()), unseen)
bookkeeping.readback(torch.zeros((), **i64), torch.zeros((), **i64), torch.zeros(()))
# mapped I/O (dsv4.replay CONFIG mapped_io): the readback's host store and the input token's fetch
bookkeeping.readback(torch.zeros((), **i64), torch.zeros((), **i64), torch.zeros(()), torch.zeros(2, dtype=torch.float64))
bookkeeping.fetch(torch.zeros(1, **i64), torch.zeros(1, **i64))
for B in (1, 3, 32):  # a pipelined solo step's batch of one, and batched steps
    held, act, tokens = bookkeeping.batch_begin(torch.zeros((), dtype=torch.bool), torch.zeros(B, dtype=torch.bool),
                                                torch.zeros(B, dtype=torch.bool), torch.zeros(B, **i64),
                                                torch.zeros(B, **i64))
    bookkeeping.batch_end(torch.zeros((), dtype=torch.bool), held, torch.zeros(()), torch.zeros(B, **i64), act,
                          torch.zeros(B, **i64))
for dtype in (torch.float32, torch.bfloat16):  # the head's logits in the model's dtype, the state's fp32
    bookkeeping.settle(torch.zeros((), dtype=torch.bool), torch.zeros(4, 4096, dtype=dtype),
                       torch.zeros(4, 4096, dtype=dtype), torch.zeros(129280, dtype=dtype), torch.zeros(129280),
                       torch.zeros((), **i64), torch.zeros((), **i64), 1)
    for active in (None, torch.zeros((), dtype=torch.bool)):  # CONFIG fold_settle: from the verdict, solo and batched
        bookkeeping.settle(torch.zeros(()), torch.zeros(4, 4096, dtype=dtype), torch.zeros(4, 4096, dtype=dtype),
                           torch.zeros(129280, dtype=dtype), torch.zeros(129280), torch.zeros((), **i64),
                           torch.zeros((), **i64), 1, forwards=torch.zeros((), **i64), active=active)
for dtype in (torch.float32, torch.bfloat16):
    h = torch.zeros(1, 4, 4096, dtype=dtype)
    hc.hc_pre(h, torch.zeros(1, 24), torch.zeros(24), torch.ones(3), 4, 20, 1e-6, 1e-6)
    hc_post.hc_post(torch.zeros(1, 4096, dtype=dtype), torch.zeros(1, 4), torch.zeros(1, 4, 4), h)
    hc_head.hc_head(h, torch.zeros(1, 4), torch.zeros(4), torch.ones(1), 1e-6, 1e-6)
    for keep in (None, torch.ones(2, dtype=torch.bool)):
        commit.commit(torch.zeros(8, 512, dtype=dtype), torch.zeros(2, dtype=torch.int64), torch.zeros(2, 512),
                      keep, torch.zeros(()))
    x = torch.zeros(2, 4096, dtype=dtype)
    norm.rms_norm(x, torch.ones(4096, dtype=dtype), 1e-6)
    norm.rms_norm(x, None, 1e-6)
    # attention's q (Flash: 32 heads of a rank of 2, unweighted) and kv (weighted by kv_norm, fp32 or x's dtype)
    cos, sin = torch.zeros(1, 32), torch.zeros(1, 32)
    normrope.norm_rope(torch.zeros(1, 32, 512, dtype=dtype), None, 1e-6, cos, sin)
    for weight_dtype in (dtype, torch.float32):
        normrope.norm_rope(torch.zeros(1, 512, dtype=dtype), torch.ones(512, dtype=weight_dtype), 1e-6, cos, sin)
    # DSV4_FUSE_QKV: q_res's and kv's column views of the stacked wq_a/wkv output of a batched step (strided rows)
    q_a, kv_a = torch.zeros(4, 1024 + 512, dtype=dtype).split([1024, 512], dim=-1)
    norm.rms_norm(q_a, torch.ones(1024, dtype=dtype), 1e-6)
    for weight_dtype in (dtype, torch.float32):
        normrope.norm_rope(kv_a, torch.ones(512, dtype=weight_dtype), 1e-6, torch.zeros(4, 32), torch.zeros(4, 32))
    # layout CONFIG pair_norms: both in one launch, a solo step's rows and a batched step's
    for rows in (1, 4):
        q_a, kv_a = torch.zeros(rows, 1024 + 512, dtype=dtype).split([1024, 512], dim=-1)
        for weight_dtype in (dtype, torch.float32):
            normrope.q_kv_norms(q_a, torch.ones(1024, dtype=weight_dtype), kv_a, torch.ones(512, dtype=weight_dtype),
                                1e-6, torch.zeros(rows, 32), torch.zeros(rows, 32))
    for inverse in (False, True):
        rope.apply_rope(torch.zeros(2, 64, 512, dtype=dtype), torch.zeros(2, 32), torch.zeros(2, 32), inverse)
        rope.apply_rope(torch.zeros(2, 512, dtype=dtype), torch.zeros(2, 32), torch.zeros(2, 32), inverse)
    for scale_dtype in (torch.float8_e8m0fnu, torch.float32):
        qgemv_variants(dtype, scale_dtype)
        # prefill's experts: Flash's w1 stack written into the left half of a w1|w3 buffer
        dequant.dequant_into(QWeight(torch.zeros(4, 2048, 2048, dtype=torch.int8),
                                     torch.zeros(4, 2048, 128, dtype=scale_dtype), "fp4"),
                             torch.empty(4, 4096, 4096, dtype=dtype)[:, :2048])
        # a long chunk's FP8 linear dequantised for its GEMM: whole blocks, and a slice inside its blocks
        for row0 in (0, 64):
            dequant.fp8_dequant(QWeight(torch.zeros(1024, 4096, dtype=torch.float8_e4m3fn),
                                        torch.zeros(9, 32, dtype=scale_dtype), "fp8", row0=row0), dtype)
    for seen in (None, torch.zeros((), dtype=dtype)):  # a step's first door, then the ones adding their previous flag
        door.pack(torch.zeros(4096, dtype=dtype), torch.zeros(4097, dtype=dtype), torch.zeros(()),
                  torch.zeros((), dtype=torch.int64), seen, None if seen is None else torch.zeros(()))
    for tid2eid in (None, torch.zeros(129280, 6, dtype=torch.int64)):
        route.route(torch.zeros(1, 256, dtype=dtype), torch.zeros(1, dtype=torch.int64), torch.zeros(256),
                    tid2eid, 6, True, 1.5)
        # the gate and the router in one launch (Flash's gate [256, 4096] bf16, a stored weight): one row, and 3
        for rows in (1, 3):
            gate_route.gate_route(torch.zeros(rows, 4096, dtype=dtype), torch.empty(256, 4096, dtype=dtype),
                                  torch.zeros(rows, dtype=torch.int64), torch.zeros(256), tid2eid, 6, True, 1.5,
                                  stored=True)


def compressor_variants(dtype):
    """Flash's CSA (rate 4, overlapping) and HCA (rate 128) pooling, the indexer's, and its scores."""
    cfg = preset("flash")
    step = Step(torch.zeros((), dtype=torch.int64), 1, Rope(cfg, "cpu"), cfg.sliding_window)
    z = dict(dtype=dtype)
    for m, dim, overlap in ((4, 512, True), (4, 128, True), (128, 512, False)):
        width, R = (2 * dim, 2 * m) if overlap else (dim, m)
        win = step.windows(m, R, 1026)
        compressor.pool(torch.zeros(1, width, **z), torch.zeros(1, width, **z), torch.zeros(R, width, **z),
                        torch.zeros(R, width, **z), torch.zeros(m, width), torch.ones(dim), win, overlap, 1e-6)
    win = step.windows(4, 8, 1026)
    cos, sin = step.cos_sin("compress")
    compressor.index_keys(torch.zeros(1, 64, 128, **z), torch.zeros(1, 64, **z), cos, sin, torch.zeros(1026, 128, **z),
                          torch.zeros(1, 128, **z), win.committed, win.visible)


for dtype in (torch.float32, torch.bfloat16):
    compressor_variants(dtype)


def geometry_variants():
    """A decode step's geometry at Flash's shapes (window 128; CSA rate 4 with its ring of 8, HCA 128), alone
    (1 and 2 tokens, with and without an active flag) and pooled (3 rows)."""
    W, rows = preset("flash").sliding_window, 16384
    ids, pos = torch.tensor([2, 0, 3]), torch.zeros(3, dtype=torch.int64)
    for T in (1, 2):
        geometry.sliding(pos[0], T, W)
        for m, R in ((4, 8), (128, 128)):
            for active in (None, torch.ones((), dtype=torch.bool)):
                geometry.windows(pos[0], T, m, R, rows, (T + m - 2) // m + 1, active=active)
    geometry.sliding(pos, 1, W, ids=ids)
    for m, R in ((4, 8), (128, 128)):
        geometry.windows(pos, 1, m, R, rows, 1, ids=ids, active=torch.ones(3, dtype=torch.bool))
    for T in (63, 128):  # DSV4_GEOMETRY_CHUNKS: a prefill chunk's, one compile per power of two of its length
        geometry.sliding(pos[0], T, W)
        for m, R in ((4, 8), (128, 128)):
            geometry.windows(pos[0], T, m, R, rows, (T + m - 2) // m + 1)


geometry_variants()



def attention_variants(dtype, T, H, hd, half, rows, kinds=("sliding", "csa", "hca")):
    """Decode attention: sliding only, CSA (512 picks), HCA over a store of `rows` rows."""
    z = dict(dtype=dtype)
    args = (torch.zeros(T, H, hd, **z), torch.zeros(128, hd, **z), torch.zeros(T, hd, **z),
            torch.zeros(T, 128 + T, dtype=torch.bool), torch.zeros(H), torch.zeros(T, half), torch.zeros(T, half))
    comp, new = torch.zeros(rows, hd, **z), torch.zeros(2, hd, **z)
    extra = {"sliding": {},
             "csa": dict(comp=comp, new=new, sel=torch.zeros(T, 512, dtype=torch.int64),
                         valid=torch.zeros(T, 512, dtype=torch.bool)),
             "hca": dict(comp=comp, new=new, committed=torch.zeros(rows, dtype=torch.bool),
                         new_visible=torch.zeros(T, 2, dtype=torch.bool))}
    for kind in kinds:
        assert attention.supported(*args, **extra[kind])
        attention.attention(*args, **extra[kind])


attention_variants(torch.bfloat16, 1, 32, 512, 32, 1026)  # Flash, a rank of 2: tensor-core tiles
attention_variants(torch.float32, 2, 16, 64, 8, 6, ("hca",))  # fp32 tiles (GPU tests)
attention_variants(torch.float32, 1, 2, 32, 8, 6, ("csa",))  # tiny: the broadcast path
attention.CONFIG["combine_split_d"] = not attention.CONFIG["combine_split_d"]  # the other combine (a program a head)
attention_variants(torch.bfloat16, 1, 32, 512, 32, 1026, ("csa",))
attention.CONFIG["combine_split_d"] = not attention.CONFIG["combine_split_d"]
# A launch variant benchmarks/attention_bench.py tries: several tiles per program.
default = dict(attention.CONFIG)
if SWEEPS:
    attention.CONFIG.update({"block_n": 16, "tiles": 2, "num_warps": 4})
    attention_variants(torch.bfloat16, 1, 32, 512, 32, 1026, ("csa",))
    attention.CONFIG.update(default)
# The combine in the split launch (fused_combine, at most fused_max_splits): Flash at 5 and 8 splits (a store of 6
# rows: sliding and HCA; of 100 rows: HCA), fp32 tiles at 5; tiny's broadcast path (keys in tiles of 16) at 9.
attention.CONFIG.update({"fused_combine": True})
attention_variants(torch.bfloat16, 1, 32, 512, 32, 6, ("sliding", "hca"))
attention_variants(torch.bfloat16, 1, 32, 512, 32, 100, ("hca",))
attention_variants(torch.float32, 2, 16, 64, 8, 6, ("hca",))
attention.CONFIG.update({"fused_max_splits": 9})
attention_variants(torch.float32, 1, 2, 32, 8, 6, ("hca",))
attention.CONFIG.update(default)


def pooled_variants(dtype, H, hd, half):
    """The pooled decode variants (dsv4.kernels.pooled): 3 rows of a pool of 4 slots, Flash's compressors and
    indexer; attention with H heads of hd."""
    cfg = preset("flash")
    B, slots = 3, 4
    ids = torch.tensor([2, 0, 3])
    step = PoolStep(torch.zeros(B, dtype=torch.int64), ids, Rope(cfg, "cpu"), cfg.sliding_window)
    z = dict(dtype=dtype)
    for m, dim, overlap in ((4, 512, True), (4, 128, True), (128, 512, False)):
        width, R = (2 * dim, 2 * m) if overlap else (dim, m)
        win = step.windows(m, R, 1026)
        compressor.pool(torch.zeros(B, width, **z), torch.zeros(B, width, **z), torch.zeros(slots, R, width, **z),
                        torch.zeros(slots, R, width, **z), torch.zeros(m, width), torch.ones(dim), win, overlap, 1e-6,
                        ids=ids)
    win = step.windows(4, 8, 1026)
    cos, sin = step.cos_sin("compress")
    compressor.index_keys(torch.zeros(B, 64, 128, **z), torch.zeros(B, 64, **z), cos, sin,
                          torch.zeros(slots, 1026, 128, **z), torch.zeros(B, 1, 128, **z), win.committed, win.visible,
                          ids=ids)
    W = cfg.sliding_window
    args = (torch.zeros(B, H, hd, **z), torch.zeros(slots, W, hd, **z), torch.zeros(B, hd, **z),
            torch.zeros(B, W + 1, dtype=torch.bool), torch.zeros(H), torch.zeros(B, half), torch.zeros(B, half))
    comp, new = torch.zeros(slots, 1026, hd, **z), torch.zeros(B, 1, hd, **z)
    for extra in ({}, dict(comp=comp, new=new, sel=torch.zeros(B, 512, dtype=torch.int64),
                           valid=torch.zeros(B, 512, dtype=torch.bool)),
                  dict(comp=comp, new=new, committed=torch.zeros(B, 1026, dtype=torch.bool),
                       new_visible=torch.zeros(B, 1, dtype=torch.bool))):
        assert attention.supported(*args, **extra, ids=ids)
        attention.attention(*args, **extra, ids=ids)


pooled_variants(torch.bfloat16, 32, 512, 32)  # Flash, a rank of 2
pooled_variants(torch.float32, 2, 512, 32)  # fp32, few heads: the broadcast path
attention.CONFIG.update({"fused_combine": True})
pooled_variants(torch.bfloat16, 32, 512, 32)
attention.CONFIG.update(default)


def verify_variants(dtype, R, H, hd, half):
    """A verify step's attention with its rows as one chunk (layout CONFIG verify_chunk): R rows of Flash's layers,
    each a decode step's keys (sliding, CSA's 512 picks, HCA over 1026 store rows at rate 128)."""
    W, z, rows = preset("flash").sliding_window, dict(dtype=dtype), 1026
    verify = torch.arange(R, dtype=torch.int64)
    args = (torch.zeros(R, H, hd, **z), torch.zeros(W, hd, **z), torch.zeros(R, hd, **z),
            torch.zeros(R, W + 1, dtype=torch.bool), torch.zeros(H), torch.zeros(R, half), torch.zeros(R, half))
    comp, new = torch.zeros(rows, hd, **z), torch.zeros(2, hd, **z)
    for extra, rate in (({}, 0), (dict(comp=comp, new=new, sel=torch.zeros(R, 512, dtype=torch.int64),
                                       valid=torch.zeros(R, 512, dtype=torch.bool)), 4),
                        (dict(comp=comp, new=new, committed=torch.zeros(R, rows, dtype=torch.bool),
                              new_visible=torch.zeros(R, 1, dtype=torch.bool)), 128)):
        assert attention.supported(*args, **extra, verify=verify, rate=rate)
        attention.attention(*args, **extra, verify=verify, rate=rate)


verify_variants(torch.bfloat16, 4, 32, 512, 32)  # Flash, a rank of 2
attention.CONFIG.update({"fused_combine": True})
verify_variants(torch.bfloat16, 4, 32, 512, 32)
attention.CONFIG.update(default)


def xproj_variants(dtype):
    """DSV4_FUSE_XPROJ: Flash's stacked x projections of 3 rows (CSA: compressor wkv | wgate, indexer wkv | wgate,
    weights_proj; HCA: wkv | wgate) split into column views (strided rows) for the compressor's pool (a 3-token chunk
    and a pooled step), the index keys' head weights and the ring rows' commit."""
    cfg = preset("flash")
    B, slots, z = 3, 4, dict(dtype=dtype)
    ids = torch.tensor([2, 0, 3])
    rope = Rope(cfg, "cpu")
    steps = {"plain": Step(torch.zeros((), dtype=torch.int64), B, rope, cfg.sliding_window),
             "pooled": PoolStep(torch.zeros(B, dtype=torch.int64), ids, rope, cfg.sliding_window)}
    csa = torch.zeros(B, 2624, **z).split([1024, 1024, 256, 256, 64], dim=-1)
    hca = torch.zeros(B, 1024, **z).split([512, 512], dim=-1)
    for kind, step in steps.items():
        pooled = dict(ids=ids) if kind == "pooled" else {}
        ring = (slots,) if pooled else ()
        for (kv, gate), m, dim, overlap in ((csa[0:2], 4, 512, True), (csa[2:4], 4, 128, True), (hca, 128, 512, False)):
            width, R = (2 * dim, 2 * m) if overlap else (dim, m)
            compressor.pool(kv, gate, torch.zeros(*ring, R, width, **z), torch.zeros(*ring, R, width, **z),
                            torch.zeros(m, width), torch.ones(dim), step.windows(m, R, 1026), overlap, 1e-6, **pooled)
        win = step.windows(4, 8, 1026)
        cos, sin = step.cos_sin("compress")
        new = torch.zeros(B, 1, 128, **z) if pooled else torch.zeros(win.cur.shape[0], 128, **z)
        compressor.index_keys(torch.zeros(B, 64, 128, **z), csa[4], cos, sin, torch.zeros(*ring, 1026, 128, **z), new,
                              win.committed, win.visible, **pooled)
    for keep in (None, torch.ones(B, dtype=torch.bool)):
        commit.commit(torch.zeros(8, 1024, **z), torch.zeros(B, dtype=torch.int64), csa[0], keep, torch.zeros(()))


for dtype in (torch.float32, torch.bfloat16):
    xproj_variants(dtype)


def pool_switch_variants(dtype):
    """dsv4.kernels.compressor's one_pass and pair switches, each way: Flash's CSA pools (the compressor's 512
    channels, the indexer's 128) alone and paired, and its HCA pool, a token's and a pooled step's, on the stacked
    projections' column views (strided rows, as the decode step reads them)."""
    cfg = preset("flash")
    B, slots, z = 3, 4, dict(dtype=dtype)
    ids = torch.tensor([2, 0, 3])
    rope = Rope(cfg, "cpu")
    steps = {"plain": Step(torch.zeros((), dtype=torch.int64), 1, rope, cfg.sliding_window),
             "pooled": PoolStep(torch.zeros(B, dtype=torch.int64), ids, rope, cfg.sliding_window)}
    for kind, step in steps.items():
        pooled = dict(ids=ids) if kind == "pooled" else {}
        ring = (slots,) if pooled else ()
        csa = torch.zeros(B if pooled else 1, 2624, **z).split([1024, 1024, 256, 256, 64], dim=-1)
        win = step.windows(4, 8, 1026)
        parts = [(kv, gate, torch.zeros(*ring, 8, 2 * dim, **z), torch.zeros(*ring, 8, 2 * dim, **z),
                  torch.zeros(4, 2 * dim), torch.ones(dim)) for (kv, gate), dim in ((csa[0:2], 512), (csa[2:4], 128))]
        hca = torch.zeros(B if pooled else 1, 1024, **z).split([512, 512], dim=-1)
        hca_win = step.windows(128, 128, 1026)
        for one_pass in (False, True):
            compressor.CONFIG.update(one_pass=one_pass)
            for part in parts:
                compressor.pool(*part, win, True, 1e-6, **pooled)
            for ticket in (False, True):  # HCA's channel split normed by a second launch / by its last programs
                compressor.CONFIG.update(ticket_norm=ticket)
                compressor.pool(*hca, torch.zeros(*ring, 128, 512, **z), torch.zeros(*ring, 128, 512, **z),
                                torch.zeros(128, 512), torch.ones(512), hca_win, False, 1e-6, **pooled)
            compressor.CONFIG.update(ticket_norm=pool_default["ticket_norm"])
            assert compressor.pair_supported(*parts, win, True)
            compressor.pool_pair(*parts, win, True, 1e-6, **pooled)


pool_default = dict(compressor.CONFIG)
for dtype in (torch.float32, torch.bfloat16):
    pool_switch_variants(dtype)
compressor.CONFIG.update(pool_default)
# The pools before their wait and the index keys' loads but the new keys' (DSV4_POOL_EARLY, where the model says so):
# every pool form above, a token's and a pooled step's, and the index keys of both.
_plain = {name: getattr(compressor, name) for name in ("pool", "pool_pair", "index_keys")}
compressor.CONFIG.update(early=True)
for name, fn in _plain.items():
    setattr(compressor, name, lambda *a, _fn=fn, **kw: _fn(*a, **kw, early=True))
for dtype in (torch.float32, torch.bfloat16):
    compressor_variants(dtype)
    pool_switch_variants(dtype)
pooled_variants(torch.bfloat16, 32, 512, 32)
for name, fn in _plain.items():
    setattr(compressor, name, fn)
compressor.CONFIG.update(pool_default)


def prefill_attention_variants(dtype, H, hd, half, window, rows, picks, kinds=("sliding", "csa", "hca")):
    """Prefill attention: sliding only, CSA (`picks` picks), HCA over a store of `rows` rows (3 new windows)."""
    T, z = 64, dict(dtype=dtype)
    args = (torch.zeros(T, H, hd, **z), torch.zeros(window, hd, **z), torch.zeros(T, hd, **z),
            torch.zeros(T, window + T, dtype=torch.bool), torch.zeros(H), torch.zeros(T, half), torch.zeros(T, half))
    comp, new = torch.zeros(rows, hd, **z), torch.zeros(3, hd, **z)
    extra = {"sliding": {},
             "csa": dict(comp=comp, new=new, sel=torch.zeros(T, picks, dtype=torch.int64),
                         valid=torch.zeros(T, picks, dtype=torch.bool)),
             "hca": dict(comp=comp, new=new, committed=torch.zeros(rows, dtype=torch.bool),
                         new_visible=torch.zeros(T, 3, dtype=torch.bool))}
    for kind in kinds:
        assert prefill_attention.supported(*args, **extra[kind])
        prefill_attention.attention(*args, **extra[kind])


prefill_attention_variants(torch.bfloat16, 64, 512, 32, 128, 1026, 512)  # Flash, a rank of 2
prefill_attention_variants(torch.float32, 4, 32, 8, 8, 26, 8)  # tiny in fp32 (the model test on a GPU)
# The launch configurations benchmarks/prefill_attention_bench.py tries.
default = dict(prefill_attention.CONFIG)
for cfg in ({"num_stages": 3}, {"num_stages": 1}, {"block_n": 64}, {"block_n": 16}, {"block_h": 32},
            {"skip_picks": True, "skip_rows": False}) if SWEEPS else ():
    prefill_attention.CONFIG.update(cfg)
    prefill_attention_variants(torch.bfloat16, 64, 512, 32, 128, 1026, 512)
    prefill_attention.CONFIG.update(default)

# The launch configurations benchmarks/qgemv_bench.py tries.
default = dict(qgemv.CONFIG)
for cfg in ({"kernel": "v1", "defer": True, "block_n": 16, "block_k_fp8": 256, "block_k_fp4": 128, "num_warps": 4},
            {"kernel": "v1", "defer": True, "block_n": 64, "block_k_fp8": 128, "block_k_fp4": 64, "num_warps": 8},
            {"kernel": "v1", "defer": False, "block_n": 32, "block_k_fp8": 128, "block_k_fp4": 64,
             "num_warps": None})[:3 if SWEEPS else 1]:
    qgemv.CONFIG.update(cfg)
    qgemv_variants(torch.bfloat16, torch.float8_e8m0fnu)
# v2 (split-K and not, every weight kind) at its default tiles and at the other tiles the benchmark sweeps.
for cfg in ({"kernel": "v2"}, {"kernel": "v2", "v2_block_n": 8, "v2_block_k_fp8": 1024, "v2_block_k_fp4": 512,
                               "v2_num_warps": 8},
            {"kernel": "v2", "v2_block_k_fp8": 1024}, {"kernel": "v2", "v2_block_k_fp8": 1024, "v2_num_warps": 8},
            {"kernel": "v2", "v2_block_n": 32, "v2_block_k_fp8": 1024, "v2_num_warps": 8},
            {"kernel": "v2", "v2_block_n": 8, "v2_block_k_fp8": 2048, "v2_block_k_fp4": 1024, "v2_num_warps": 8},
            )[:6 if SWEEPS else 1]:
    qgemv.CONFIG.update(cfg)
    qgemv_variants(torch.bfloat16, torch.float8_e8m0fnu)
    qgemv.CONFIG.update(default)
# v2's FP8 tile loop not unrolled (DSV4_QGEMV_UNROLL=0)
for cfg in ({"kernel": "v2", "v2_unroll": False},):
    qgemv.CONFIG.update(cfg)
    qgemv_variants(torch.bfloat16, torch.float8_e8m0fnu)
    qgemv.CONFIG.update(default)
qgemv.CONFIG.update(kernel="v2")
qgemv_variants(torch.float32, torch.float32)
# the splits summed in a second launch (DSV4_FUSED_SPLIT_SUM=0) and in the GEMV's own (the ticket reduce)
for fused_sum in (False, True):
    qgemv.CONFIG.update(kernel="v2", v2_fused_sum=fused_sum)
    qgemv_variants(torch.bfloat16, torch.float8_e8m0fnu)
    qgemv_variants(torch.float32, torch.float32)
qgemv.CONFIG.update(default)


def qgemv_rows_variants(rows, dtype=torch.bfloat16, scale_dtype=torch.float8_e8m0fnu, every=True):
    """A batched decode step's rows sharing one weight: v2's programs of several rows (v2_rows), with split-K
    (wq_a's shape); `every`: also without (an N wide enough), the grouped wo_a and an FP4 weight."""
    x = torch.zeros(rows, 4096, dtype=dtype)
    for n in (1024, 8192) if every else (1024,):
        qgemv.linear(x, QWeight(torch.zeros(n, 4096, dtype=torch.float8_e4m3fn),
                                torch.zeros(n // 128, 32, dtype=scale_dtype), "fp8"))
    if every:
        qgemv.grouped_linear(torch.zeros(rows, 8 * 512, dtype=dtype),
                             QWeight(torch.zeros(8 * 128, 512, dtype=torch.float8_e4m3fn),
                                     torch.zeros(8, 4, dtype=scale_dtype), "fp8"), 8)
        qgemv.linear(x, QWeight(torch.zeros(2048, 2048, dtype=torch.int8), torch.zeros(2048, 128, dtype=scale_dtype),
                                "fp4"))


# 8 rows (the default cap); the benchmark's cap of 16, the other split sum and fp32 on the split shape (the
# compiler's time grows with the rows: CI keeps to these)
qgemv_rows_variants(8)
for cfg, rows, dtype, scale_dtype in (({"v2_fused_sum": False}, 8, torch.bfloat16, torch.float8_e8m0fnu),
                                      ({}, 8, torch.float32, torch.float32),
                                      ({"v2_rows": 16}, 16, torch.bfloat16, torch.float8_e8m0fnu))[:3 if SWEEPS else 2]:
    qgemv.CONFIG.update(cfg)
    qgemv_rows_variants(rows, dtype, scale_dtype, every=False)
    qgemv.CONFIG.update(default)

# v3 (tensor-core tiles of 16 rows; the routed experts stay on v2): a solo step (1 row) and a batched one (16), bf16
# x with FP8 split and not, the grouped wo_a and a 2-D FP4 weight; the second-launch split sum; fp32 x; the wider
# tiles the benchmark sweeps
for cfg, rows, dtype, scale_dtype, every in (({}, 1, torch.bfloat16, torch.float8_e8m0fnu, True),
                                             ({}, 16, torch.bfloat16, torch.float8_e8m0fnu, True),
                                             ({"v2_fused_sum": False}, 16, torch.bfloat16, torch.float8_e8m0fnu, False),
                                             ({}, 16, torch.float32, torch.float32, False),
                                             ({"v3_block_n": 64, "v3_block_k_fp8": 128}, 16, torch.bfloat16,
                                              torch.float8_e8m0fnu, False))[:5 if SWEEPS else 4]:
    qgemv.CONFIG.update(kernel="v3", **cfg)
    qgemv_rows_variants(rows, dtype, scale_dtype, every)
    qgemv.CONFIG.update(default)


def dense_variants(rows=2, shapes=6):
    """Flash's dense products at decode: a compressor's wkv (bf16, split-K), a vocab slice wide enough
    for no split (bf16), the mHC mix (fp32, 64 splits), x and weight of either dtype, and a K that is
    not a whole number of tiles (the masked loads)."""
    for n, k, w_dtype, x_dtype in ((1024, 4096, torch.bfloat16, torch.bfloat16), (4224, 4096, torch.bfloat16, torch.bfloat16),
                                   (24, 16384, torch.float32, torch.float32), (64, 4096, torch.float32, torch.bfloat16),
                                   (64, 4096, torch.bfloat16, torch.float32), (100, 300, torch.bfloat16, torch.bfloat16))[:shapes]:
        dense.linear(torch.zeros(rows, k, dtype=x_dtype), torch.empty(n, k, dtype=w_dtype), stored=True)
    # a weight converted in the step (not stored): no early load, no launch_pdl
    dense.linear(torch.zeros(rows, 300, dtype=torch.bfloat16), torch.empty(100, 300, dtype=torch.bfloat16))
    # the head collapse's mix from the bf16 streams into fp32 (hc_head CONFIG wide_mix)
    dense.linear(torch.zeros(rows, 16384, dtype=torch.bfloat16), torch.empty(4, 16384), stored=True,
                 dtype=torch.float32)
    # the head's vocabulary slice of a Flash rank of 2 (CONFIG shape_tiles: its own K tiles; torch.empty touches
    # none of its 512 MiB)
    dense.linear(torch.zeros(rows, 4096, dtype=torch.bfloat16), torch.empty(64640, 4096, dtype=torch.bfloat16),
                 stored=True)


# at the default tiles and at those benchmarks/dense_bench.py sweeps
default = dict(dense.CONFIG)
for cfg in ({}, {"fused_sum": True}) + (({"block_n": 8}, {"block_n": 32, "num_warps": 8}, {"block_k_bytes": 512},
                                          {"block_k_bytes": 2048}, {"programs": 528}) if SWEEPS else ()):
    dense.CONFIG.update(cfg)
    dense_variants()
    dense.CONFIG.update(default)
# rows per program (CONFIG rows): 1 (a solo step), 8 (the default cap); the benchmark's cap of 16 and the other
# split sum on the first three shapes (the compiler's time grows with the rows: CI keeps to these)
for cfg, rows, shapes in (({}, 1, 6), ({}, 8, 6), ({"fused_sum": False}, 8, 3), ({"rows": 16}, 16, 3))[:4 if SWEEPS else 3]:
    dense.CONFIG.update(cfg)
    dense_variants(rows, shapes)
    dense.CONFIG.update(default)

# v3 (tensor-core tiles, bf16 x and weight): Flash's compressor wkv (split-K), a vocab slice (no split), a K that is
# not a whole number of tiles, stored (the early tile; launch_pdl under DSV4_PDL); 1 and 16 rows, the second-launch
# split sum, the tiles the benchmark sweeps; at the default tiles a weight converted in the step too (no wait)
for cfg, rows in (({}, 1), ({}, 16), ({"fused_sum": False}, 16), ({"v3_block_n": 64, "v3_block_k": 128}, 16),
                  ({"v3_block_n": 16, "v3_block_k": 512}, 16))[:5 if SWEEPS else 3]:
    dense.CONFIG.update(kernel="v3", **cfg)
    for n, k in ((1024, 4096), (4224, 4096), (100, 300)):
        dense.linear(torch.zeros(rows, k, dtype=torch.bfloat16), torch.empty(n, k, dtype=torch.bfloat16), stored=True)
    if not cfg:
        dense.linear(torch.zeros(rows, 300, dtype=torch.bfloat16), torch.empty(100, 300, dtype=torch.bfloat16))
    dense.CONFIG.update(default)


def moe_variants(dtype, scale_dtype):
    """The Flash decode shapes of rank 0 of 2: 128 local FP4 experts (I 2048, D 4096), the FP8 shared
    expert's rows 1024..2047 (starting at a scale block), and FP8 experts (expert_dtype fp8)."""
    ids, weights = torch.zeros(1, 6, dtype=torch.int64), torch.zeros(1, 6, dtype=dtype)
    x = torch.zeros(1, 4096, dtype=dtype)
    fp4 = [QWeight(torch.zeros(4, n, k // 2, dtype=torch.int8), torch.zeros(4, n, k // 32, dtype=scale_dtype), "fp4")
           for n, k in ((2048, 4096), (2048, 4096), (4096, 2048))]
    moe.routed(x, ids, weights, fp4, 0, 10.0, add=x)  # with CONFIG shared_add: kernel 2 adds the shared output
    fp8 = [QWeight(torch.zeros(4, n, k, dtype=torch.float8_e4m3fn), torch.zeros(4, n // 128, k // 128,
                                                                                dtype=scale_dtype), "fp8")
           for n, k in ((2048, 4096), (2048, 4096), (4096, 2048))]
    moe.routed(x, ids, weights, fp8, 0, 10.0, add=x)
    shared = QWeight(torch.zeros(1024, 4096, dtype=torch.float8_e4m3fn), torch.zeros(8, 32, dtype=scale_dtype),
                     "fp8", 1024, 0)
    moe.shared_gate_up(x, shared, shared, 10.0)
    for stacks in (fp4, fp8):  # CONFIG shared_launch: the routed rows' and the shared expert's kernel 1 in one launch
        moe.routed_and_shared_gate_up(x, ids, stacks[0], stacks[1], 0, shared, shared, 10.0)


moe_variants(torch.bfloat16, torch.float8_e8m0fnu)
moe_variants(torch.float32, torch.float32)
# kernel 1's options (benchmarks/moe_bench.py's arms): split-K with the fused or the second-launch sum, compact rows
default = dict(moe.CONFIG)
for cfg in ({"shared_add": True}, {"gate_up_paired": False, "down_split_experts": False},
            {"gate_up_split_k": 2, "shared_split_k": 2, "fused_sum": False, "compact": True}) + (
        ({"compact": True}, {"gate_up_split_k": 4, "shared_split_k": 4},
         {"gate_up_split_k": 4, "gate_up_block_n": 8, "compact": True}) if SWEEPS else ()):
    moe.CONFIG.update(cfg)
    moe_variants(torch.bfloat16, torch.float8_e8m0fnu)
    moe.CONFIG.update(default)


def tensor_core_variants(dtype, scale_dtype):
    """The routed experts on the tensor cores (dsv4.kernels.moe_tc: a prefill chunk's) at Flash's shapes: a step's
    one-program plan and a prefill wave's torch plan."""
    stacks = [QWeight(torch.zeros(4, n, k // 2, dtype=torch.int8), torch.zeros(4, n, k // 32, dtype=scale_dtype), "fp4")
              for n, k in ((2048, 4096), (2048, 4096), (4096, 2048))]
    for T in (1, 200):
        x = torch.zeros(T, 4096, dtype=dtype)
        moe_tc.routed(x, torch.zeros(T, 6, dtype=torch.int64), torch.zeros(T, 6, dtype=dtype), stacks, 0, 10.0, add=x)
    order = moe_tc.CONFIG["order"]
    for other in moe_tc.ORDERS if SWEEPS else ():  # DSV4_MOE_TC_ORDER's other orders: the slow set (CI's minutes)
        moe_tc.CONFIG["order"] = other
        moe_tc.routed(x, torch.zeros(T, 6, dtype=torch.int64), torch.zeros(T, 6, dtype=dtype), stacks, 0, 10.0, add=x)
    moe_tc.CONFIG["order"] = order
    x = torch.zeros(300, 4096, dtype=dtype)  # a long chunk's tiles (CONFIG long)
    for _, block_m, block_n in moe_tc.CONFIG["long"]:
        moe_tc.routed(x, torch.zeros(300, 6, dtype=torch.int64), torch.zeros(300, 6, dtype=dtype), stacks, 0, 10.0,
                      add=x, tiles=(block_m, block_n))


tensor_core_variants(torch.bfloat16, torch.float8_e8m0fnu)
if SWEEPS:  # an fp32 model's (the tests' dtype on a GPU, IEEE dots): the slow set (CI's minutes, session 37)
    tensor_core_variants(torch.float32, torch.float32)
bf16_decode = moe_tc.CONFIG["bf16_decode"]
if SWEEPS:  # DSV4_MOE_TC_BF16_DECODE's other side (bf16 x, ue8m0 scales): the slow set (CI's minutes, session 37)
    moe_tc.CONFIG["bf16_decode"] = not bf16_decode
    tensor_core_variants(torch.bfloat16, torch.float8_e8m0fnu)
moe_tc.CONFIG["bf16_decode"] = bf16_decode
plan_fixed = moe_tc.CONFIG["plan_fixed"]
for fixed in (True, False):  # the plan at plan_pairs' sizes (default), and per wave size (DSV4_MOE_TC_PLAN_FIXED=0)
    moe_tc.CONFIG["plan_fixed"] = fixed
    moe_tc.plan(torch.zeros(3, 6, dtype=torch.int64), 0, 128)
moe_tc.CONFIG["plan_fixed"] = plan_fixed


def gluon_compile_only(kernel):
    """compile_only for a Gluon kernel (dsv4.kernels.moe_gl: already jitted, its source a GluonASTSource)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    return kernels.with_pdl(_recorder(kernel, kernel.fn.__name__, GluonASTSource))


def shared_early():
    """Kernel 1 with its shared programs first, their sums before their wait (moe_gl CONFIG shared_early, the model's
    form: the caller says x was written two launches back), 1, 3 and 16 tokens (grouped), and kernel 2's sums before
    its wait (CONFIG down_early): their PTX holds BEHIND."""
    shared = QWeight(torch.zeros(1024, 4096, dtype=torch.float8_e4m3fn), torch.zeros(8, 32, dtype=torch.float8_e8m0fnu),
                     "fp8", 1024, 0)
    stacks = [QWeight(torch.zeros(4, 2048, 2048, dtype=torch.int8), torch.zeros(4, 2048, 128, dtype=torch.float8_e8m0fnu),
                      "fp4") for _ in range(2)]
    for dtype in (torch.bfloat16, torch.float16):
        for T in (1, 3, 16):
            x, ids = torch.zeros(T, 4096, dtype=dtype), torch.zeros(T, 6, dtype=torch.int64)
            groups = torch.zeros(T * 6, expert_groups.GROUP_ROW, dtype=torch.int32) if T > 1 else None
            moe_gl.gate_up_shared(x, ids, stacks[0], stacks[1], 0, shared, shared, 10.0, groups, early=True)
    # kernel 2's tensor-core programs with their sums before the wait (CONFIG down_early: h two launches back), one
    # token and a one-row batch's, with the shared output added and without: their PTX holds BEHIND
    down = QWeight(torch.zeros(4, 4096, 1024, dtype=torch.int8), torch.zeros(4, 4096, 64, dtype=torch.float8_e8m0fnu),
                   "fp4")
    was = moe_gl.CONFIG["down_early"]
    moe_gl.CONFIG["down_early"] = True
    for dtype in (torch.bfloat16, torch.float16):
        h, ids = torch.zeros(6, 2048, dtype=dtype), torch.zeros(1, 6, dtype=torch.int64)
        for add in (torch.zeros(1, 4096, dtype=dtype), None):
            moe_gl.down(h, ids, torch.zeros(1, 6, dtype=dtype), down, 0, add, torch.zeros(1, 4096, dtype=dtype),
                        early=True)
    moe_gl.CONFIG["down_early"] = was
    # CONFIG down_prefetch: one token's kernel 2 with its w2 rows prefetched before the wait (its PTX holds PREFETCHING;
    # early given too, which prefetch overrides), at I = 2,048 (8 lines a row) and 1,024 (4)
    for i_width in (2048, 1024):
        w2 = QWeight(torch.zeros(4, 4096, i_width // 2, dtype=torch.int8),
                     torch.zeros(4, 4096, i_width // 32, dtype=torch.float8_e8m0fnu), "fp4")
        for dtype in (torch.bfloat16, torch.float16):
            h, ids = torch.zeros(6, i_width, dtype=dtype), torch.zeros(1, 6, dtype=torch.int64)
            for add in (torch.zeros(1, 4096, dtype=dtype), None):
                moe_gl.down(h, ids, torch.zeros(1, 6, dtype=dtype), w2, 0, add, torch.zeros(1, 4096, dtype=dtype),
                            early=True, prefetch=True)


def gluon_variants():
    """dsv4.kernels.moe_gl (DSV4_MOE_GLUON) at Flash's shapes: kernel 1 of a 1-, 3- and 16-token step, alone and with
    the shared expert's rows (rank 1 of 2's), kernel 2 with the shared output added and without, its ticketed sum and
    the second launch's."""
    from dsv4.kernels import qgemv as _qgemv

    moe_gl._launch = gluon_compile_only
    stacks = [QWeight(torch.zeros(4, n, k // 2, dtype=torch.int8), torch.zeros(4, n, k // 32, dtype=torch.float8_e8m0fnu),
                      "fp4") for n, k in ((2048, 4096), (2048, 4096), (4096, 2048))]
    shared = QWeight(torch.zeros(1024, 4096, dtype=torch.float8_e4m3fn), torch.zeros(8, 32, dtype=torch.float8_e8m0fnu),
                     "fp8", 1024, 0)
    for dtype in (torch.bfloat16, torch.float16):
        for T in (1, 3, 16):
            x = torch.zeros(T, 4096, dtype=dtype)
            ids, weights = torch.zeros(T, 6, dtype=torch.int64), torch.zeros(T, 6, dtype=dtype)
            # CONFIG grouped's programs (DSV4_MOE_GL_GROUPED) take expert_groups' table where the MMA runs
            for groups in (None, torch.zeros(T * 6, expert_groups.GROUP_ROW, dtype=torch.int32)) if T > 1 else (None,):
                h = moe_gl.gate_up(x, ids, stacks[0], stacks[1], 0, 10.0, groups)
                moe_gl.gate_up_shared(x, ids, stacks[0], stacks[1], 0, shared, shared, 10.0, groups)
                for add in (x, None):
                    moe_gl.down(h, ids, weights, stacks[2], 0, add, torch.empty_like(x), groups)
    tickets = _qgemv.tickets_for
    _qgemv.tickets_for = lambda count, device: None  # the sum in a second launch
    moe_gl.down(h, ids, weights, stacks[2], 0, x, torch.empty_like(x))
    _qgemv.tickets_for = tickets


if moe_gl.gl is not None:  # under DSV4_PDL=1 too (since session 15): their PTX checked as every kernel's
    _mma = dict(moe_gl.CONFIG)
    moe_gl.CONFIG["mma"] = False  # the CUDA-core programs (DSV4_MOE_MMA=0)
    gluon_variants()
    for tiles, unroll in ((1, 2), (1, 4), (1, 8)) if SWEEPS else ((1, 4),):  # the tensor-core programs (default 1 x 4)
        moe_gl.CONFIG.update(mma=True, mma_tiles=tiles, mma_unroll=unroll)
        gluon_variants()
    # DSV4_MOE_GL_MAXNREG=128 (steps of more than one token), DSV4_MOE_GL_SOLO_MAXNREG=64 and
    # DSV4_MOE_GL_SOLO_DOWN_MAXNREG=40 (one token)
    moe_gl.CONFIG.update(mma=True, mma_tiles=1, mma_unroll=4, gate_up_maxnreg=128, solo_gate_up_maxnreg=64,
                         solo_down_maxnreg=40)
    gluon_variants()
    moe_gl.CONFIG.update(_mma)
    shared_early()
    # CONFIG stamps (benchmarks/moe_stamps.py): a one-token step's kernels 1 and 2 writing their programs' times
    moe_gl.CONFIG["stamps"] = {"k1": torch.zeros(1, 1024, 4, dtype=torch.int64),
                               "k2": torch.zeros(1, 1536, 4, dtype=torch.int64), "slots": 1, "next": {"k1": 0, "k2": 0}}
    gluon_variants()
    moe_gl.CONFIG["stamps"] = None


def qgemv_mma_variants():
    """dsv4.kernels.qgemv_mma (the mma GEMV family, DSV4_QGEMV=mma) at the FP8 linears of a Flash rank (1 of 2) and of
    mini: a lone row, 3 and 16 rows, the grouped wo_a, a rank's slice 64 rows into its scale block, and the split sum
    in a second launch (no tickets)."""
    qgemv_mma._launch = gluon_compile_only
    shapes = ((1536, 4096, 0), (16384, 1024, 0), (4096, 4096, 1024), (4096, 4096, 0), (8192, 1024, 0),
              (4096, 1024, 0), (32768, 1024, 0), (8192, 4096, 1024), (4096, 8192, 0))
    for n, k, group_n in shapes:
        w = QWeight(torch.zeros(n, k, dtype=torch.float8_e4m3fn),
                    torch.zeros(n // 128 + 1, k // 128, dtype=torch.float8_e8m0fnu), "fp8", 64, 0)
        xk = k * (n // group_n) if group_n else k
        for rows in (1, 3, 16):
            x = torch.zeros(rows, xk, dtype=torch.bfloat16)
            qgemv_mma.launch(x, w, torch.zeros(rows, n, dtype=torch.bfloat16), rows, group_n,
                             torch.zeros(1 << 16, dtype=torch.int32))
        if qgemv_mma.splits(n, k) > 1:
            qgemv_mma.launch(x, w, torch.zeros(rows, n, dtype=torch.bfloat16), rows, group_n, None)


if qgemv_mma.gl is not None:
    qgemv_mma_variants()


def prefill_moe_variants(dtype, scale_dtype):
    """Prefill's FP4 experts at Flash's shapes (4 of a rank's experts here), at each tile height block_m picks."""
    stacks = [QWeight(torch.zeros(4, n, k // 2, dtype=torch.int8), torch.zeros(4, n, k // 32, dtype=scale_dtype), "fp4")
              for n, k in ((2048, 4096), (2048, 4096), (4096, 2048))]
    for pairs in (24, 200, 600):  # block_m 16, 32, 64 over 4 experts
        ends = torch.full((4,), pairs, dtype=torch.int32)
        prefill_moe.experts(torch.zeros(pairs, 4096, dtype=dtype), torch.zeros(pairs, dtype=torch.int64), ends,
                            stacks, 10.0)


prefill_moe_variants(torch.bfloat16, torch.float8_e8m0fnu)
prefill_moe_variants(torch.float32, torch.float32)

# The step's commit in one launch: the table's dtype codes are runtime values, so one variant per
# rows-per-write split (decode: 1; a prefill chunk: up to MAX_SPLIT).
for n in (1, 100):
    commit_step.commit([Write(torch.zeros(128, 512, dtype=torch.bfloat16), torch.zeros(n, dtype=torch.int64),
                              torch.zeros(n, 512, dtype=torch.bfloat16), torch.ones(n, dtype=torch.bool))],
                       torch.zeros(()))


# A verify step's writes (kernels/undo.py, CONFIG fused): a row's writes applied with their old rows saved (one row
# a write: split 1), and every record taken back in one launch; dtype codes are runtime values.
undo.apply([Write(torch.zeros(128, 512, dtype=torch.bfloat16), torch.zeros(1, dtype=torch.int64),
                  torch.zeros(1, 512, dtype=torch.bfloat16), torch.ones(1, dtype=torch.bool))],
           [torch.zeros(1, 512, dtype=torch.bfloat16)])
undo.take_back([(torch.zeros(128, 512, dtype=torch.bfloat16), torch.zeros(1, dtype=torch.int64),
                 torch.zeros(1, 512, dtype=torch.bfloat16), 0)], torch.zeros(2, dtype=torch.bool))
# A verify step's rows as one chunk (layout CONFIG verify_chunk): a layer's writes of 4 rows in one application, their
# records tagged by row (a device tensor of the row behind each index).
undo.apply([Write(torch.zeros(128, 512, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.int64),
                  torch.zeros(4, 512, dtype=torch.bfloat16))], [torch.zeros(4, 512, dtype=torch.bfloat16)])
undo.take_back([(torch.zeros(128, 512, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.int64),
                 torch.zeros(4, 512, dtype=torch.bfloat16), torch.arange(4))], torch.zeros(4, dtype=torch.bool))


def hc_boundary_variants(dtype):
    """Flash's boundary (hc 4, D 4096): between sublayers and after the embedding (its rows given, or gathered from
    the table by token id), norm weights of either dtype; each without a door and opening one (door.CONFIG in_place:
    the step's first door, then doors that add the previous door's flag; the payload in the model's dtype or gloo's
    fp32)."""
    h, fn = torch.zeros(1, 4, 4096, dtype=dtype), torch.zeros(24, 4 * 4096)
    for first in (False, True):
        for norm_dtype in (dtype, torch.float32):
            for opened in (None, *doors(dtype, first)):
                hc_boundary.boundary(torch.zeros(1, 4096, dtype=dtype), torch.zeros(1, 4), torch.zeros(1, 4, 4),
                                     None if first else h, fn, torch.zeros(24), torch.ones(3),
                                     torch.ones(4096, dtype=norm_dtype), 4, 20, 1e-6, 1e-6, opened)
                if first:
                    hc_boundary.boundary(torch.zeros(8, 4096, dtype=dtype), None, None, None, fn, torch.zeros(24),
                                         torch.ones(3), torch.ones(4096, dtype=norm_dtype), 4, 20, 1e-6, 1e-6, opened,
                                         ids=torch.zeros(1, dtype=torch.int64))


def doors(dtype, first: bool) -> list:
    from dsv4.parallel import Door

    seen = None if first else torch.zeros((), dtype=dtype)
    return [Door(0, 0, torch.zeros(4097, dtype=wire), 4096, torch.Size((1, 4096)), torch.zeros(()),
                 torch.zeros((), dtype=torch.int64), seen, torch.zeros(()))
            for wire in {dtype, torch.float32}]


# at the default tiles and at those benchmarks/hc_boundary_bench.py sweeps
default = dict(hc_boundary.CONFIG)
for cfg in ({},) + (({"block_d": 16}, {"block_d": 64}, {"block_d": 128, "num_warps": 8, "block_r": 2048})
                   if SWEEPS else ()):
    hc_boundary.CONFIG.update(cfg)
    for dtype in (torch.bfloat16, torch.float32):
        hc_boundary_variants(dtype)
    hc_boundary.CONFIG.update(default)
# the finish's options (their own constexprs: the door's bookkeeping is the same code either way)
for cfg in ({"one_pass_finish": True}, {"warp_maps": True}, {"one_pass_finish": True, "warp_maps": True},
            {"sinkhorn_rcp": True}):
    hc_boundary.CONFIG.update(cfg)
    for dtype in (torch.bfloat16, torch.float32):
        for first in (False, True):
            hc_boundary.boundary(torch.zeros(1, 4096, dtype=dtype), torch.zeros(1, 4), torch.zeros(1, 4, 4),
                                 None if first else torch.zeros(1, 4, 4096, dtype=dtype), torch.zeros(24, 4 * 4096),
                                 torch.zeros(24), torch.ones(3), torch.ones(4096, dtype=dtype), 4, 20, 1e-6, 1e-6)
    hc_boundary.CONFIG.update(default)

# the sampler's draw: one row (the launcher makes n == 1 a constant) and a pooled step's rows
for n in (1, 16):
    draw.uniform(torch.zeros(n, dtype=torch.int64), torch.zeros(n, dtype=torch.int64))

# the sampler's token: Flash's vocabulary (32 chunks, a tail) alone and pooled, with and without the kept set; a
# vocabulary of one chunk; bf16 logits
for n, vocab, dtype in ((1, 129280, torch.float32), (16, 129280, torch.float32), (1, 1000, torch.float32),
                        (1, 129280, torch.bfloat16)):
    for kept in (None, torch.zeros(n, vocab, dtype=torch.bool)):
        sample.token(torch.zeros(n, vocab, dtype=dtype), torch.ones(n), torch.zeros(n, dtype=torch.int64),
                     torch.zeros(n, dtype=torch.int64), kept)

# the Gumbel-max draw (DSV4_SAMPLER=gumbel): the same shapes as the inverse draw's token
for n, vocab, dtype in ((1, 129280, torch.float32), (16, 129280, torch.float32), (1, 1000, torch.float32),
                        (1, 129280, torch.bfloat16)):
    for kept in (None, torch.zeros(n, vocab, dtype=torch.bool)):
        gumbel.token(torch.zeros(n, vocab, dtype=dtype), torch.ones(n), torch.zeros(n, dtype=torch.int64),
                     torch.zeros(n, dtype=torch.int64), kept, torch.zeros(1 << 24))

# the indexer's top-k (one variant per row length's power of two): Flash's k over a small store (k == N), the
# decode benchmark's store (1027 keys), the limit's two largest; a k and N of no power of two (tiny's GPU tests);
# the other keys_per_thread the benchmark sweeps at the benchmark's store
for n, k in ((512, 512), (1027, 512), (8192, 512), (topk.MAX_N, 512), (100, 13)):
    topk.smallest(torch.zeros(1, n, dtype=torch.int64), k, compressor._VISIBLE_BELOW)
default = dict(topk.CONFIG)
for per_thread in (8, 32):
    topk.CONFIG.update(keys_per_thread=per_thread)
    topk.smallest(torch.zeros(1, 1027, dtype=torch.int64), 512, compressor._VISIBLE_BELOW)
    topk.CONFIG.update(default)

def _compile(i: int) -> str | None:
    k, src, options, params, early = pending[i]
    start = time.perf_counter()
    try:
        out = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    except Exception as e:  # reported with the variant's key; the parent exits 1
        return f"{k}: {type(e).__name__}: {e}"[-3000:]
    if TIMES:
        print("COMPILE_S", k[0], round(time.perf_counter() - start, 2), flush=True)
    if not out.asm.get("cubin"):
        return f"{k}: no cubin"
    problems = check_pdl(out.asm["ptx"], k[0], params, options.get("launch_pdl", False), early) if PDL else \
        ["griddepcontrol without DSV4_PDL"] * ("griddepcontrol" in out.asm["ptx"])
    if PDL and options.get("launch_pdl") and not check_pdl(_wait_moved_to_the_end(out.asm["ptx"]), k[0], params, True, early):
        problems.append("check_pdl passes the wait moved behind the kernel's reads")
    if DIGEST:
        print("SASS", k[0], k[1], sorted((o, v) for o, v in options.items() if o != "launch_pdl" or v),
              sass_digest(out.asm["cubin"]))
    return f"{k[0]} {k[1]}: " + "; ".join(problems) if problems else None


def sass_digest(cubin: bytes) -> str:
    """The sha256 of the cubin's SASS as nvdisasm prints it (no line information: a kernel moved in its file keeps
    its digest), 16 hex digits."""
    import hashlib
    import subprocess
    import tempfile

    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout
    return hashlib.sha256(sass.encode()).hexdigest()[:16]


def _wait_moved_to_the_end(ptx: str) -> str:
    """The PTX with its first wait moved before its last `ret`: what check_pdl must refuse (its own check)."""
    lines = ptx.split("\n")
    wait = lines.pop(next(i for i, line in enumerate(lines) if WAIT in line))
    lines.insert(max(i for i, line in enumerate(lines) if line.strip() == "ret;"), wait)
    return "\n".join(lines)


WAIT, RELEASE = "griddepcontrol.wait", "griddepcontrol.launch_dependents"


def check_pdl(ptx: str, name: str, params: list, waits: bool, early_load: bool) -> list[str]:
    """The kernel's PTX against DSV4_PDL's contract (the module's doc), on every path of its control flow: what a
    global memory access or the release may find before it is what every path from the entry has passed."""
    blocks = _blocks(ptx)
    if not any(RELEASE in i for b in blocks for i in b[0]):
        return [f"no {RELEASE}"]
    if any(WAIT in i for b in blocks for i in b[0]) != waits:
        return [f"{WAIT} {'missing' if waits else 'in a kernel launched without launch_pdl'}"]
    pointers = {i for i, (_, t) in enumerate(params) if t.startswith("*")}
    early = {i for i, (n, _) in enumerate(params) if n in EARLY.get(name, ())}
    taint = _taint([i for b in blocks for i in b[0]], pointers)
    problems, before_wait = [], 0
    release_first = name.endswith(":release")  # RELEASING: the release may come first
    for instr, passed in _passes(blocks, WAIT if waits else RELEASE):
        if not _global_access(instr) and not (waits and RELEASE in instr and not release_first):
            continue
        if passed:
            continue
        address = set().union(*(taint.get(r, set()) for r in _REG.findall(_bracketed(instr))))
        if waits and instr.startswith("ld.") and _global_access(instr) and address and address <= early:
            before_wait += 1  # a stored weight's load in flight while the kernel waits
        else:
            problems.append(f"{instr!r} (from {sorted(params[i][0] for i in address)}) not after "
                            f"{WAIT if waits else RELEASE} on every path")
    if waits and early_load and not before_wait:
        problems.append(f"no weight load before {WAIT}")
    return problems[:3]


_LABEL = re.compile(r"^(\$?\w+):$")
_PRED = re.compile(r"^@!?%\w+\s+")
_REG = re.compile(r"%\w+")


def _blocks(ptx: str) -> list:
    """The entry's basic blocks: [instructions (predicate stripped), successor indices], in text order."""
    body = ptx[ptx.index(".entry"):]
    body = body[body.index("{", body.index(")")):]
    blocks, labels, targets = [[[], None]], {}, []
    for raw in body.splitlines():
        line = raw.split("//")[0].strip()
        if not line or line.startswith(".") or line in ("{", "}"):
            continue
        if m := _LABEL.match(line):
            labels[m.group(1)] = len(blocks)
            blocks.append([[], None])
            continue
        instr = _PRED.sub("", line).rstrip(";").strip()
        blocks[-1][0].append(instr)
        if instr.startswith(("bra", "ret", "exit", "trap")):
            target = instr.split()[-1] if instr.startswith("bra") else None
            targets.append((len(blocks) - 1, target, line.startswith("@")))
            blocks.append([[], None])
    succs = [[i + 1] if i + 1 < len(blocks) else [] for i in range(len(blocks))]
    for i, target, conditional in targets:
        succs[i] = ([labels[target]] if target else []) + ([i + 1] if conditional else [])
    for b, s in zip(blocks, succs):
        b[1] = s
    return blocks


def _passes(blocks, marker: str):
    """(instruction, whether every path from the entry to it passes an instruction containing marker)."""
    preds = [[] for _ in blocks]
    for i, (_, succs) in enumerate(blocks):
        for s in succs:
            preds[s].append(i)
    has = [any(marker in i for i in b[0]) for b in blocks]
    into = [i != 0 for i in range(len(blocks))]  # a block no path reaches stays True
    changed = True
    while changed:
        changed = False
        for i in range(1, len(blocks)):
            now = all(into[p] or has[p] for p in preds[i])
            changed |= now != into[i]
            into[i] = now
    for i, (instrs, _) in enumerate(blocks):
        passed = into[i]
        for instr in instrs:
            yield instr, passed
            passed = passed or marker in instr


def _taint(instrs: list, pointers: set) -> dict:
    """Register -> the pointer arguments (indices) its value derives from, over every instruction (a fixpoint:
    loops feed values back)."""
    taint: dict = {}
    changed = True
    while changed:
        changed = False
        for instr in instrs:
            op, _, rest = instr.partition(" ")
            if op.startswith(("st.", "red.", "bra", "bar", "griddepcontrol", "ret", "fence", "membar")) or not rest:
                continue
            rest = rest.strip()
            cut = rest.index("}") + 1 if rest.startswith("{") else (rest.index(",") if "," in rest else len(rest))
            dsts, srcs = _REG.findall(rest[:cut]), rest[cut:]
            t = {int(p) for p in re.findall(r"_param_(\d+)\b", srcs) if int(p) in pointers}
            t = t.union(*(taint.get(r, set()) for r in _REG.findall(srcs)))
            for d in dsts:
                if not t <= taint.get(d, set()):
                    taint[d] = taint.get(d, set()) | t
                    changed = True
    return taint


def _global_access(instr: str) -> bool:
    op = instr.split(" ", 1)[0]
    return op.startswith(("ld.", "st.", "atom.", "red.", "cp.async")) and not any(
        s in op for s in (".param", ".shared", ".local", ".const"))


def _bracketed(instr: str) -> str:
    return instr[instr.index("["):instr.index("]") + 1] if "[" in instr else ""


def _one_of_each_class(variants: list) -> list:
    """The first variant of each class: a kernel, its flags (the constants that are bools, 0 / 1 or strings: its
    constexpr branches) and its options. The others differ from it in sizes (tiles, widths, the shapes' constants) or
    in their arguments' types (an fp32 model's against bf16's) only. CI compiles the classes (its 15 minutes: 261 of
    463 variants, 3 min 44 s -> ~2 min alone on 2 cores); the slow set (sweeps) and DSV4_COMPILE_ALL=1 every variant."""
    seen, kept = set(), []
    for v in variants:
        name, key, options = v[0]
        flags = tuple(x for x in key if isinstance(x, tuple) and (isinstance(x[1], (bool, str)) or x[1] in (0, 1)))
        if (name, flags, options) not in seen:
            seen.add((name, flags, options))
            kept.append(v)
    return kept


def compile_pending() -> list[str]:
    """Every recorded variant compiled in forked workers (the variants are independent; CI's 2 cores halve the
    check's minutes): the failures' messages."""
    import multiprocessing

    if not (SWEEPS or DIGEST or os.environ.get("DSV4_COMPILE_ALL", "0") == "1"):
        pending[:] = _one_of_each_class(pending)
    workers = min(4, os.cpu_count() or 1)
    if workers == 1:
        return [m for m in map(_compile, range(len(pending))) if m]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return [m for m in pool.map(_compile, range(len(pending)), chunksize=4) if m]


def sampler_layouts() -> list[str]:
    """The sampler's kernels must lay a chunk out alike with and without a kept set (kernels/sample.py _kept_arg):
    Triton picks a layout from its loads' widths, the layout the order of the chunk's sums, and a row's token must
    not depend on whether another row of its step keeps a subset (session 14). Compares the sm_90 TTGIR's blocked
    layouts of each kernel, fp32 and bf16 logits, without a set and with one as the kernels read it (checked to fail
    with one-byte flags)."""
    problems = []
    for fn, extra in ((sample._chunk_kernel, {}), (sample._pick_kernel, {"C_PAD": 32})):
        jit = triton.jit(fn)
        names = jit.arg_names
        for logits in (torch.float32, torch.bfloat16):
            kept_arg = sample._kept_arg(torch.zeros(1, 8, dtype=logits), torch.ones(1, 8, dtype=torch.bool))
            layouts = []
            for kept_type in (TYPES[logits], TYPES[kept_arg.dtype]):
                sig = {n: ("*" + kept_type if n == "kept_ptr" else "*fp32" if n.endswith("_ptr") else "i32")
                       for n in names}
                sig.update(logits_ptr="*" + TYPES[logits], key_ptr="*i64", pos_ptr="*i64", token_ptr="*i64",
                           top_id_ptr="*i32")
                consts = {"BLOCK": 4096, "HAS_KEPT": kept_type != TYPES[logits], **extra}
                sig = {n: ("constexpr" if n in consts else t) for n, t in sig.items() if n in names}
                # as the launcher marks them for Flash's vocabulary (V 129,280 and C 32: multiples of 16)
                attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
                         if sig[n].startswith("*") or n in ("V", "C")}
                src = ASTSource(fn=jit, signature=sig, constexprs={(names.index(n),): v for n, v in consts.items()},
                                attrs=attrs)
                ttgir = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8}).asm["ttgir"]
                layouts.append([line.split(" = ", 1)[1] for line in ttgir.splitlines() if line.startswith("#blocked")])
            if layouts[0] != layouts[1]:
                problems.append(f"{fn.__name__} {logits}: layout {layouts[0]} without a kept set, {layouts[1]} with")
    return problems


failures = compile_pending() + sampler_layouts()
for message in failures:
    print("FAILED", message)
names = sorted({k[0].split(":")[0] for k in compiled})
print("COMPILED", len(pending), "of", len(compiled), "variants", names)
waiting = sorted({v[0] for v in pdl_variants if v[1]})
print("PDL", "waiting:", waiting) if PDL else None
if PDL and waiting != names:
    failures.append(f"launched without launch_pdl: {sorted(set(names) - set(waiting))}")
# every kernel the modules define (a `_..._kernel` function) must have compiled at least once
defined = sorted({name for m in KERNEL_MODULES for name in vars(m) if name.startswith("_") and name.endswith("_kernel")})
if moe_gl.gl is None:
    defined = [name for name in defined if not name.endswith("_gl_kernel")]
missing = sorted(set(defined) - set(names))
print("NOT COMPILED", missing) if missing else None
sys.exit(1 if missing or failures else 0)
