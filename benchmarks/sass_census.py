"""Static SASS census of the decode kernels for an H100/H200 (sm_90), compiled on this machine (no GPU):
instructions by opcode, in total and in the kernel's hottest loop, so that a kernel change's instruction cost
per weight element is known before a device call.

    python benchmarks/sass_census.py [--kernel gl|gl_grouped|gate_up|down|tc|qgemv|qgemv_fp4|dense|boundary|route] [--top 25] [--dump FILE]
                                     [--rows 1] [--gemv v2|v3]

Each wrapper runs with CPU tensors of the Flash decode shape (rank 0 of 2, one token, or --rows rows of a batched
step for the GEMVs qgemv, qgemv_fp4 and dense, whose kernels --gemv picks); the launcher is replaced
by one that compiles the launch's specialisation (as tests/compile_kernels.py) and disassembles the cubin with
the nvdisasm Triton ships. One record per kernel, `SASS {...}`: instructions, registers/spills/stack, the hottest
loop's instructions by opcode and per weight element, and the whole kernel's. The loop is the longest backward branch's body (the K loop); its instructions are
divided by the weight elements a thread decodes per iteration, passed by --elements (or 0: not divided).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile

assert os.environ.get("TRITON_INTERPRET", "0") != "1", "the census needs the compiler, not the interpreter"

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from dsv4.receipts import emit  # noqa: E402

TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.uint8: "u8", torch.int8: "i8",
         torch.int16: "i16", torch.int32: "i32", torch.int64: "i64", torch.bool: "i1",
         torch.float8_e4m3fn: "fp8e4nv", torch.float8_e8m0fnu: "u8"}
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
compiled: list = []


def compile_only(fn, t, jit=None, source=ASTSource):
    """A launcher that compiles the launch's specialisation for sm_90 (as tests/compile_kernels.py) and keeps it in
    `compiled` as (kernel name, grid, compiled kernel). jit, source: an already jitted kernel and its source class
    (a Gluon kernel: GluonASTSource)."""
    jit = jit or triton.jit(fn)
    fn = jit.fn if hasattr(jit, "fn") else fn

    class Launch:
        def __getitem__(self, grid):
            def run(*args, **constexprs):
                options = {k: constexprs.pop(k) for k in ("num_warps", "num_stages", "launch_pdl", "maxnreg") if k in constexprs}
                sig, attrs = {}, {}
                for i, (name, a) in enumerate(zip(jit.arg_names, args)):
                    if type(a) is int and a == 1:
                        constexprs[name] = 1
                        continue
                    if isinstance(a, torch.Tensor):
                        sig[name] = "*" + TYPES[a.dtype]
                        attrs[(i,)] = [["tt.divisibility", 16]]
                    else:
                        sig[name] = "fp32" if isinstance(a, float) else "i32"
                        if isinstance(a, int) and a % 16 == 0:
                            attrs[(i,)] = [["tt.divisibility", 16]]
                for name in [n for n, v in constexprs.items() if isinstance(v, torch.Tensor)]:  # a pointer by name
                    sig[name] = "*" + TYPES[constexprs.pop(name).dtype]
                    attrs[(jit.arg_names.index(name),)] = [["tt.divisibility", 16]]
                for p in jit.params[len(args):]:  # a constant left to its default: the default, as a launch takes it
                    if p.name not in constexprs and p.name not in sig and p.has_default:
                        constexprs[p.name] = p.default
                for name in constexprs:
                    sig[name] = "constexpr"
                sig = {n: sig[n] for n in jit.arg_names if n in sig}  # the kernel's parameter order
                src = source(fn=jit, signature=sig, constexprs={(jit.arg_names.index(n),): v
                                                                for n, v in constexprs.items()}, attrs=attrs)
                out = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
                compiled.append((fn.__name__, grid, out))
            return run
    return Launch()


def tool(name: str, cubin: bytes, *flags) -> str:
    """The stdout of one of the CUDA binary tools Triton ships (nvdisasm, cuobjdump) on a cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([os.path.join(BIN, name), *flags, f.name], check=True, capture_output=True,
                              text=True).stdout


def sass(cubin: bytes) -> list[str]:
    return [ln for ln in tool("nvdisasm", cubin, "-c").splitlines()
            if re.match(r"\s+/\*[0-9a-f]{4,}\*/\s", ln) or re.match(r"\.L_x_\d+:", ln)]


def resources(cubin: bytes) -> str:
    """Registers, spills and stack of the cubin's kernels (cuobjdump --dump-resource-usage)."""
    return " ".join(m.group(0) for m in re.finditer(r"(REG|STACK|SHARED|LOCAL):\d+",
                                                  tool("cuobjdump", cubin, "--dump-resource-usage")))


def parse(lines: list[str]) -> list[tuple[int, str, str]]:
    """(address, opcode, text) of each instruction; a label's line as (next address, "LABEL", name)."""
    out = []
    for ln in lines:
        if ln.startswith(".L_x_"):
            out.append((None, "LABEL", ln.rstrip(":")))
            continue
        m = re.match(r"\s+/\*([0-9a-f]+)\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)(.*)", ln)
        if m:
            out.append((int(m.group(1), 16), m.group(3), ln.strip()))
    return out


def hottest_loop(ins):
    """The body of the longest backward branch (a loop): its instructions."""
    labels, pending = {}, []
    for addr, op, text in ins:
        if op == "LABEL":
            pending.append(text)
        elif pending:
            labels.update({name: addr for name in pending})
            pending = []
    ins = [i for i in ins if i[1] != "LABEL"]
    best = (0, -1)
    for addr, op, text in ins:
        m = re.search(r"`\((\.L_x_\d+)\)", text) if op.startswith("BRA") else None
        if m and labels.get(m.group(1), addr) < addr and addr - labels[m.group(1)] > best[1] - best[0]:
            best = (labels[m.group(1)], addr)
    return [i for i in ins if best[0] <= i[0] <= best[1]]


def census(ins) -> collections.Counter:
    return collections.Counter(op.split(".")[0] for _, op, _ in ins)


def build(kernel: str, rows: int = 1):
    from dsv4.kernels import dense, hc_boundary, moe, moe_tc, qgemv, route
    from dsv4.formats import QWeight
    for module in (dense, hc_boundary, moe, moe_tc, qgemv, route):
        module.launcher = compile_only
    x = torch.zeros(1, 4096, dtype=torch.bfloat16)
    rows_x = torch.zeros(rows, 4096, dtype=torch.bfloat16)  # the GEMVs' input
    ids, weights = torch.zeros(1, 6, dtype=torch.int64), torch.zeros(1, 6, dtype=torch.bfloat16)
    e8 = torch.float8_e8m0fnu
    fp4 = [QWeight(torch.zeros(4, n, k // 2, dtype=torch.int8), torch.zeros(4, n, k // 32, dtype=e8), "fp4")
           for n, k in ((2048, 4096), (2048, 4096), (4096, 2048))]
    shared = QWeight(torch.zeros(1024, 4096, dtype=torch.float8_e4m3fn), torch.zeros(8, 32, dtype=e8), "fp8", 1024, 0)
    if kernel in ("gl", "gl_grouped"):  # the Gluon experts (moe_gl, tensor-core programs) of a --rows-token step
        from triton.experimental.gluon._runtime import GluonASTSource

        from dsv4.kernels import expert_groups, moe_gl
        moe_gl._launch = lambda k: compile_only(None, None, k, GluonASTSource)
        T = rows if rows > 1 or kernel == "gl" else 16  # the table is for steps of more than one token
        xt = torch.zeros(T, 4096, dtype=torch.bfloat16)
        ids_t, w_t = torch.zeros(T, 6, dtype=torch.int64), torch.zeros(T, 6, dtype=torch.bfloat16)
        groups = torch.zeros(T * 6, expert_groups.GROUP_ROW, dtype=torch.int32) if kernel == "gl_grouped" else None
        moe_gl.gate_up_shared(xt, ids_t, fp4[0], fp4[1], 0, shared, shared, 10.0, groups)
        moe_gl.down(torch.zeros(T * 6, 2048, dtype=torch.bfloat16), ids_t, w_t, fp4[2], 0, xt, torch.empty_like(xt),
                    groups)
    elif kernel == "gate_up":
        moe.routed_and_shared_gate_up(x, ids, fp4[0], fp4[1], 0, shared, shared, 10.0)
    elif kernel == "down":
        moe.routed(x, ids, weights, fp4, 0, 10.0, add=x)
    elif kernel == "tc":  # the experts on the tensor cores (DSV4_MOE_TC), a step of `rows` tokens
        moe_tc.CONFIG["mode"] = "all"
        moe_tc.routed(rows_x, torch.zeros(rows, 6, dtype=torch.int64), torch.zeros(rows, 6, dtype=torch.bfloat16), fp4,
                      0, 10.0, add=rows_x)
    elif kernel == "qgemv":
        qgemv.linear(rows_x, QWeight(torch.zeros(1024, 4096, dtype=torch.float8_e4m3fn),
                                     torch.zeros(8, 32, dtype=e8), "fp8"))
    elif kernel == "wo":  # mini's wo_a (8 groups of 1,024 rows over 4,096 inputs each) and wo_b (4,096 x 8,192)
        qgemv.grouped_linear(torch.zeros(rows, 8 * 4096, dtype=torch.bfloat16),
                             QWeight(torch.zeros(8192, 4096, dtype=torch.float8_e4m3fn),
                                     torch.zeros(64, 32, dtype=e8), "fp8"), 8)
        qgemv.linear(torch.zeros(rows, 8192, dtype=torch.bfloat16),
                     QWeight(torch.zeros(4096, 8192, dtype=torch.float8_e4m3fn), torch.zeros(32, 64, dtype=e8), "fp8"))
    elif kernel == "qgemv_fp4":
        qgemv.linear(rows_x, QWeight(torch.zeros(2048, 2048, dtype=torch.int8), torch.zeros(2048, 128, dtype=e8),
                                     "fp4"))
    elif kernel == "dense":  # a compressor's wkv (split-K) and a vocab slice (one split)
        for n in (1024, 4224):
            dense.linear(rows_x, torch.zeros(n, 4096, dtype=torch.bfloat16), stored=True)
    elif kernel == "boundary":  # a mid boundary (hc 4, bf16 streams and norm weight), then the first
        for h in (torch.zeros(1, 4, 4096, dtype=torch.bfloat16), None):
            hc_boundary.boundary(x, torch.zeros(1, 4), torch.zeros(1, 4, 4), h, torch.zeros(24, 4 * 4096),
                                 torch.zeros(24), torch.ones(3), torch.ones(4096, dtype=torch.bfloat16), 4, 20, 1e-6,
                                 1e-6)
    elif kernel == "route":  # Flash's 256 experts, top 6, then a hash layer
        for tid2eid in (None, torch.zeros(129280, 6, dtype=torch.int64)):
            route.route(torch.zeros(1, 256, dtype=torch.bfloat16), torch.zeros(1, dtype=torch.int64), torch.zeros(256),
                        tid2eid, 6, True, 1.5)
    else:
        raise SystemExit(f"--kernel {kernel!r}: allowed gl, gl_grouped, gate_up, down, tc, qgemv, wo, qgemv_fp4, dense, "
                         "boundary, route")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", default="gate_up")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--elements", type=int, default=0, help="weight elements a thread decodes per loop iteration")
    ap.add_argument("--dump", help="write the SASS of the kernels here")
    ap.add_argument("--dump-ptx", help="write the PTX of the kernels here (where the compiler put an instruction "
                    "against griddepcontrol.wait)")
    ap.add_argument("--rows", type=int, default=1, help="rows of the GEMVs' input (qgemv, qgemv_fp4, dense), tokens "
                    "of the Gluon experts' step (gl; gl_grouped: 16 unless more than 1)")
    ap.add_argument("--gemv", choices=("v2", "v3"), help="the GEMVs' kernels (dsv4.kernels.select_gemv; default: "
                    "DSV4_QGEMV's and DSV4_DENSE_GEMV's)")
    args = ap.parse_args(argv)
    from dsv4 import kernels
    if args.gemv:
        kernels.select_gemv(args.gemv)
    build(args.kernel, args.rows)
    dump, ptx = [], []
    for name, grid, out in compiled:
        ptx += [f"// {name}", out.asm["ptx"]]
        ins = parse(sass(out.asm["cubin"]))
        loop = hottest_loop(ins)
        ins = [i for i in ins if i[1] != "LABEL"]
        per = round(len(loop) / args.elements, 2) if args.elements else None
        emit("SASS", kernel=name, target="sm_90", rows=args.rows, gemv=kernels.gemv(), pdl=kernels.PDL,
             instructions=len(ins), resources=resources(out.asm["cubin"]), warps=out.metadata.num_warps, loop_instructions=len(loop), loop_per_element=per,
             loop=dict(census(loop).most_common(args.top)), all=dict(census(ins).most_common(args.top)))
        dump += [f"// {name}"] + [t for _, _, t in ins]
    if args.dump:
        with open(args.dump, "w") as f:
            f.write("\n".join(dump) + "\n")
    if args.dump_ptx:
        with open(args.dump_ptx, "w") as f:
            f.write("\n".join(ptx) + "\n")


if __name__ == "__main__":
    main()
