"""Compile every kernel variant the model launches for an H100/H200 (sm_90) without a GPU.

Run as a script without TRITON_INTERPRET (tests/test_kernels.py does): the interpreter accepts
Python that the GPU compiler refuses (a plain helper function, a loop variable changing type), so
CPU tests alone would not catch it. Each wrapper is called with CPU tensors; the patched launcher
compiles the launch's signature to PTX and cubin for sm_90 instead of running it.
"""

import os
import sys

import torch

assert os.environ.get("TRITON_INTERPRET", "0") != "1", "compile checks need the compiler, not the interpreter"

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from dsv4.kernels import commit, hc, hc_post, norm, qgemv, rope  # noqa: E402
from dsv4.formats import QWeight  # noqa: E402

TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.uint8: "u8", torch.int8: "i8",
         torch.int64: "i64", torch.int32: "i32", torch.float8_e4m3fn: "fp8e4nv", torch.bool: "i1"}
compiled: set = set()


def compile_only(fn, t):
    jit = triton.jit(fn)

    class Launch:
        def __getitem__(self, grid):
            def run(*args, **constexprs):
                options = {k: constexprs.pop(k) for k in ("num_warps", "num_stages") if k in constexprs}
                names = jit.arg_names
                sig, key = {}, []
                for name, a in zip(names, args):
                    sig[name] = "*" + TYPES[a.dtype] if isinstance(a, torch.Tensor) else (
                        "fp32" if isinstance(a, float) else "i32")
                    key.append(sig[name])
                for name, v in constexprs.items():
                    sig[name] = "constexpr"
                    key.append((name, v))
                k = (fn.__name__, tuple(key), tuple(sorted(options.items())))
                if k in compiled:
                    return
                src = ASTSource(fn=jit, signature=sig,
                                constexprs={(names.index(n),): v for n, v in constexprs.items()})
                out = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
                assert out.asm.get("cubin"), k
                compiled.add(k)
            return run
    return Launch()


for module in (commit, hc, hc_post, norm, rope, qgemv):
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


for dtype in (torch.float32, torch.bfloat16):
    h = torch.zeros(1, 4, 4096, dtype=dtype)
    hc.hc_pre(h, torch.zeros(24, 4 * 4096), torch.zeros(24), torch.ones(3), 4, 20, 1e-6, 1e-6)
    hc_post.hc_post(torch.zeros(1, 4096, dtype=dtype), torch.zeros(1, 4), torch.zeros(1, 4, 4), h)
    for keep in (None, torch.ones(2, dtype=torch.bool)):
        commit.commit(torch.zeros(8, 512, dtype=dtype), torch.zeros(2, dtype=torch.int64), torch.zeros(2, 512),
                      keep, torch.zeros(()))
    x = torch.zeros(2, 4096, dtype=dtype)
    norm.rms_norm(x, torch.ones(4096, dtype=dtype), 1e-6)
    norm.rms_norm(x, None, 1e-6)
    for inverse in (False, True):
        rope.apply_rope(torch.zeros(2, 64, 512, dtype=dtype), torch.zeros(2, 32), torch.zeros(2, 32), inverse)
        rope.apply_rope(torch.zeros(2, 512, dtype=dtype), torch.zeros(2, 32), torch.zeros(2, 32), inverse)
    for scale_dtype in (torch.float8_e8m0fnu, torch.float32):
        qgemv_variants(dtype, scale_dtype)

# The launch configurations benchmarks/qgemv_bench.py tries.
default = dict(qgemv.CONFIG)
for cfg in ({"defer": True, "block_n": 16, "block_k_fp8": 256, "block_k_fp4": 128, "num_warps": 4},
            {"defer": True, "block_n": 64, "block_k_fp8": 128, "block_k_fp4": 64, "num_warps": 8}):
    qgemv.CONFIG.update(cfg)
    qgemv_variants(torch.bfloat16, torch.float8_e8m0fnu)
qgemv.CONFIG.update(default)

names = sorted({k[0] for k in compiled})
print("COMPILED", len(compiled), names)
sys.exit(0 if names == ["_commit_kernel", "_hc_post_kernel", "_hc_pre_kernel", "_qgemv_kernel", "_rms_norm_kernel", "_rope_kernel"] else 1)
