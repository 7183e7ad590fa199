"""Instructions per FP4 weight element of the MoE decode kernels (dsv4.kernels.moe), counted in their PTX for
sm_90, compiled on the CPU (no GPU): today's CUDA-core kernels against the tensor-core variant with each dot
operand choice (CONFIG "tc_dot": "fp16", "bf16"), at Flash's rank-0-of-2 shapes.

Each kernel is compiled for its launch from dsv4.kernels.moe.routed; its hottest loop is the PTX loop (a label and
the backward branch to it) with the most instructions, the K loop. Its instructions are counted by kind and divided
by the weight elements one thread handles per iteration (BLOCK_N x BLOCK_K per weight over 32 x num_warps threads;
the tensor-core gate/up loop reads both weights, today's kernel runs one loop per weight). A static count: what each iteration issues, not a measurement of time.

Run without TRITON_INTERPRET: python benchmarks/moe_tc_ptx.py [--block-n 32] [--block-k 512] [--num-warps 4]
Prints MOE_PTX {"kernel", "variant", "block_n", "block_k", "loop_instructions", "per_element", "kinds"} per arm.
"""

from __future__ import annotations

import argparse
import collections
import os
import re

import torch

assert os.environ.get("TRITON_INTERPRET", "0") != "1", "PTX counts need the compiler, not the interpreter"

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from dsv4.formats import QWeight  # noqa: E402
from dsv4.kernels import moe  # noqa: E402
from dsv4.receipts import emit  # noqa: E402

TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.uint8: "u8", torch.int64: "i64", torch.int32: "i32"}
KINDS = {  # PTX opcode prefix -> kind
    "mma": "mma", "wgmma": "mma", "ldmatrix": "shared", "ld.shared": "shared", "st.shared": "shared",
    "stmatrix": "shared", "ld.global": "global", "cvt": "cvt", "fma": "fp", "mul": "fp", "add": "fp", "sub": "fp",
    "max": "fp", "shl": "int", "shr": "int", "and": "int", "or": "int", "xor": "int", "lop3": "int", "prmt": "int",
    "selp": "select", "mov": "mov", "bar": "sync", "setp": "predicate"}


def compiled_ptx(out: dict):
    """A moe.launcher that compiles the launch for sm_90 and keeps its PTX in out[kernel name]."""
    def launcher(fn, t):
        jit = triton.jit(fn)

        class Launch:
            def __getitem__(self, grid):
                def run(*args, **constexprs):
                    options = {k: constexprs.pop(k) for k in ("num_warps", "num_stages") if k in constexprs}
                    sig, attrs = {}, {}
                    for i, (name, a) in enumerate(zip(jit.arg_names, args)):
                        if type(a) is int and a == 1:
                            constexprs[name] = 1
                            continue
                        sig[name] = "*" + TYPES[a.dtype] if isinstance(a, torch.Tensor) else (
                            "fp32" if isinstance(a, float) else "i32")
                        if (isinstance(a, torch.Tensor) and a.data_ptr() % 16 == 0) or (
                                type(a) is int and a % 16 == 0):
                            attrs[(i,)] = [["tt.divisibility", 16]]
                    for name in constexprs:
                        sig[name] = "constexpr"
                    src = ASTSource(fn=jit, signature=sig, attrs=attrs,
                                    constexprs={(jit.arg_names.index(n),): v for n, v in constexprs.items()})
                    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
                    out[fn.__name__] = (k.asm["ptx"], options.get("num_warps", 4))
                return run
        return Launch()
    return launcher


def hottest_loop(ptx: str) -> list[str]:
    """The instructions of the PTX loop (label .. backward branch to it) with the most of them."""
    lines = [line.split("//")[0].strip() for line in ptx.splitlines()]
    labels = {line[:-1]: i for i, line in enumerate(lines) if re.fullmatch(r"\$L__\w+:", line)}
    best: list[str] = []
    for i, line in enumerate(lines):
        m = re.search(r"\bbra(?:\.uni)?\s+(\$L__\w+);", line)
        if m and labels.get(m.group(1), i + 1) < i:
            body = [x for x in lines[labels[m.group(1)] + 1:i + 1] if x.endswith(";") and not x.startswith((".", "//"))]
            best = max(best, body, key=len)
    return best


def kinds(body: list[str]) -> dict:
    count = collections.Counter()
    for line in body:
        op = line.split()[1] if line.startswith("@") else line.split()[0]
        count[next((v for k, v in KINDS.items() if op.startswith(k)), "other")] += 1
    return dict(sorted(count.items()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--block-n", type=int, default=32, help="tensor-core outputs per program (both kernels)")
    ap.add_argument("--block-k", type=int, default=512, help="tensor-core inputs per K tile")
    ap.add_argument("--num-warps", type=int, default=4, help="warps of the tensor-core arms")
    args = ap.parse_args()
    D, I, n = 4096, 2048, 4
    x = torch.zeros(1, D, dtype=torch.bfloat16)
    ids, weights = torch.zeros(1, 6, dtype=torch.int64), torch.zeros(1, 6, dtype=torch.bfloat16)
    stacks = [QWeight(torch.zeros(n, r, c // 2, dtype=torch.int8), torch.zeros(n, r, c // 32, dtype=torch.float8_e8m0fnu),
                      "fp4") for r, c in ((I, D), (I, D), (D, I))]
    tc = {"tensor_cores": True, "num_warps": args.num_warps}
    arms = {"cuda_cores": {"tensor_cores": False}, "tc_fp16": {**tc, "tc_dot": "fp16"}, "tc_bf16": {**tc, "tc_dot": "bf16"}}
    default = dict(moe.CONFIG)
    for variant, overrides in arms.items():
        moe.CONFIG.update(overrides, tc_gate_up_block_n=args.block_n, tc_down_block_n=args.block_n,
                          tc_block_k=args.block_k)
        out: dict = {}
        moe.launcher = compiled_ptx(out)
        moe.routed(x, ids, weights, stacks, 0, 10.0)
        moe.CONFIG.update(default)
        for name, (ptx, warps) in out.items():
            gate_up = name == "_gate_up_kernel"
            tc = overrides["tensor_cores"]
            block_n = args.block_n if tc else moe.CONFIG["gate_up_block_n" if gate_up else "down_block_n"]
            block_k = args.block_k if tc else moe.CONFIG["block_k_fp4"]
            body = hottest_loop(ptx)
            elements = (2 if gate_up and tc else 1) * block_n * block_k / (32 * warps)  # today's: a loop per weight
            emit("MOE_PTX", kernel=name, variant=variant, block_n=block_n, block_k=block_k, warps=warps,
                 loop_instructions=len(body), elements_per_thread=elements, per_element=round(len(body) / elements, 3),
                 kinds=kinds(body))


if __name__ == "__main__":
    main()
