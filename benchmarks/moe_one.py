"""One layer's routed experts of a T-token decode step through the Gluon kernels (dsv4.kernels.moe_gl, as the model's
batched step runs them: kernel 1 with the shared expert's rows, then kernel 2), launched a few times with CONFIG
overrides: a target for a kernel profiler (ncu) that should see those launches and no others.

    ncu --clock-control none --kernel-name regex:"_gl_kernel" --launch-skip 2 --launch-count 2 --section SpeedOfLight \\
        python benchmarks/moe_one.py --tokens 16 --set grouped=0

Mini's expert shapes (D 4,096, I 2,048, 256 local FP4 experts; the shared expert FP8 [2,048, 4,096]), routes of 6
distinct experts a token drawn afresh each launch (as moe_bench: no launch finds its experts in L2).
"""

from __future__ import annotations

import argparse

import torch

from benchmarks import qgemv_bench as qb
from benchmarks.qgemv_one import apply_sets
from dsv4.config import preset
from dsv4.kernels import moe as fused_moe
from dsv4.kernels import moe_gl
from dsv4.receipts import emit, provenance


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--launches", type=int, default=4, help="layers run (each kernel once a layer)")
    ap.add_argument("--set", action="append", default=[], help="moe_gl CONFIG key=value (ints where they parse)")
    args = ap.parse_args()
    apply_sets(args.set, moe_gl.CONFIG, "moe_gl")
    cfg = preset("mini")
    D, I, E, k = cfg.hidden_size, cfg.moe_intermediate_size, cfg.n_routed_experts, cfg.num_experts_per_tok
    w1, w3, w2 = (qb.random_weight("fp4", n, kk, (E,)) for n, kk in ((I, D), (I, D), (D, I)))
    s1, s3 = (qb.random_weight("fp8", I, D) for _ in range(2))
    x = torch.randn(args.tokens, D, device="cuda", dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(args.tokens)
    with qb.configured("triton"):
        for _ in range(args.launches):
            ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(args.tokens)]).cuda()
            weights = torch.softmax(torch.randn(args.tokens, k, generator=gen), -1).to("cuda", torch.bfloat16)
            groups = fused_moe.groups_for(x, ids, w1, w3)
            h, shared_h = fused_moe.routed_and_shared_gate_up(x, ids, w1, w3, 0, s1, s3, cfg.swiglu_limit, groups)
            y = fused_moe.routed(x, ids, weights, [w1, w3, w2], 0, cfg.swiglu_limit, None, None, h, groups)
    torch.cuda.synchronize()
    emit("MOE_ONE", provenance("cuda"), tokens=args.tokens, launches=args.launches, grouped=groups is not None,
         config={key: v for key, v in moe_gl.CONFIG.items()}, abs_sum=float(y.float().abs().sum()))


if __name__ == "__main__":
    main()
