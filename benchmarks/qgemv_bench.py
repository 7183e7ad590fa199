"""The decode GEMV (dsv4.kernels.qgemv) against the device's bandwidth, per Flash weight shape and
launch configuration, with the dequantise + GEMM reference beside it.

One GPU. The bandwidth is measured in the same run (a device-to-device copy of 2 GiB: bytes read
plus written per second, median of 20). Each arm is 50 calls captured in one CUDA graph, replayed
10 times; the figure is the median per call. Bytes are what the call must read: the FP8/FP4 data
and scales of the rows it uses (6 experts of a stack for the routed ones). Shapes are rank 0's
slices of a 2-rank `flash` layer (--world 1 for one rank).

Prints QGEMV per (shape, arm), then QGEMV_LAYER per arm: one layer's mix (each linear once, the
three routed-expert stacks, the three shared-expert linears), its time and its effective bandwidth.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from dsv4.config import preset
from dsv4.kernels import qgemv
from dsv4.receipts import emit, provenance
from dsv4.formats import QWeight, quantize_fp4, quantize_fp8

CONFIGS = {
    "default": {},
    "defer_n16_k256_w4": {"defer": True, "block_n": 16, "block_k_fp8": 256, "block_k_fp4": 128, "num_warps": 4},
    "defer_n32_k128_w4": {"defer": True, "block_n": 32, "block_k_fp8": 128, "block_k_fp4": 64, "num_warps": 4},
    "defer_n64_k128_w8": {"defer": True, "block_n": 64, "block_k_fp8": 128, "block_k_fp4": 64, "num_warps": 8},
    "defer_n16_k512_w8": {"defer": True, "block_n": 16, "block_k_fp8": 512, "block_k_fp4": 256, "num_warps": 8},
}


def timed(fn, calls: int = 50, reps: int = 10) -> float:
    """Median microseconds per call of fn, captured `calls` times in one CUDA graph."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / calls)
    return statistics.median(times)


def bandwidth() -> float:
    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
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


def make(fmt: str, n: int, k: int, experts: int = 0) -> QWeight:
    q = quantize_fp8 if fmt == "fp8" else quantize_fp4
    if not experts:
        data, scale = q(torch.randn(n, k, device="cuda") * 0.02)
        return QWeight(data, scale, fmt)
    parts = [q(torch.randn(n, k, device="cuda") * 0.02) for _ in range(experts)]
    return QWeight(torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]), fmt)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--local-experts", type=int, default=16, help="stack size (the rows read are 6 of them)")
    args = ap.parse_args()
    cfg, w = preset("flash"), args.world
    D, k = cfg.hidden_size, cfg.num_experts_per_tok
    heads = cfg.num_attention_heads // w
    groups = cfg.o_groups // w
    shapes = [  # name, fmt, N, K, kind
        ("wq_a", "fp8", cfg.q_lora_rank, D, "linear"),
        ("wq_b", "fp8", heads * cfg.head_dim, cfg.q_lora_rank, "linear"),
        ("wkv", "fp8", cfg.head_dim, D, "linear"),
        ("wo_a", "fp8", groups * cfg.o_lora_rank, heads * cfg.head_dim // groups, "grouped"),
        ("wo_b", "fp8", D, cfg.o_groups * cfg.o_lora_rank // w, "linear"),
        ("indexer.wq_b", "fp8", cfg.index_n_heads * cfg.index_head_dim, cfg.q_lora_rank, "linear"),
        ("shared.w1", "fp8", cfg.moe_intermediate_size // w, D, "linear"),
        ("shared.w3", "fp8", cfg.moe_intermediate_size // w, D, "linear"),
        ("shared.w2", "fp8", D, cfg.moe_intermediate_size // w, "linear"),
        ("experts.w1", "fp4", cfg.moe_intermediate_size, D, "experts"),
        ("experts.w3", "fp4", cfg.moe_intermediate_size, D, "experts"),
        ("experts.w2", "fp4", D, cfg.moe_intermediate_size, "experts"),
    ]
    bw = bandwidth()
    emit("BANDWIDTH", provenance("cuda", "flash"), bytes_per_s=bw, scope="d2d copy of 2 GiB, read+written")
    ids = torch.tensor([1, 3, 4, 7, 9, 12][:k], device="cuda") % args.local_experts
    totals: dict[str, list[float]] = {}
    layer_bytes = 0
    for name, fmt, n, kk, kind in shapes:
        weight = make(fmt, n, kk, args.local_experts if kind == "experts" else 0)
        groups_here = groups if kind == "grouped" else 1
        x = torch.randn(1, kk * groups_here, device="cuda", dtype=torch.bfloat16)
        if kind == "experts":
            per = weight.data[0].nbytes + weight.scale[0].nbytes
            nbytes = per * len(ids)

            def ref():
                sel = QWeight(weight.data[ids], weight.scale[ids], fmt)
                return torch.einsum("rnk,k->rn", sel.dequant(torch.bfloat16), x[0])

            def fused():
                return qgemv.expert_linear(x, weight, ids, len(ids))
        elif kind == "grouped":
            nbytes = weight.nbytes

            def ref():
                wo = weight.dequant(torch.bfloat16).view(groups_here, n // groups_here, -1)
                return torch.einsum("tgi,goi->tgo", x.view(1, groups_here, -1), wo).flatten(1)

            def fused():
                return qgemv.grouped_linear(x, weight, groups_here)
        else:
            nbytes = weight.nbytes

            def ref():
                return torch.nn.functional.linear(x, weight.dequant(torch.bfloat16))

            def fused():
                return qgemv.linear(x, weight)
        layer_bytes += nbytes
        expected = ref().float().flatten()
        arms = {"torch_dequant_gemm": ref}
        for cname in CONFIGS:
            arms[cname] = fused
        for arm, fn in arms.items():
            saved = dict(qgemv.CONFIG)
            qgemv.CONFIG.update(CONFIGS.get(arm, {}))
            try:
                got = fn().float().flatten()
                err = float((got - expected).abs().max() / expected.abs().max())
                us = timed(fn)
            except Exception as e:  # a configuration that does not compile or fit is reported, not fatal
                emit("QGEMV", shape=name, arm=arm, error=f"{type(e).__name__}: {str(e)[:200]}")
                continue
            finally:
                qgemv.CONFIG.clear()
                qgemv.CONFIG.update(saved)
            totals.setdefault(arm, []).append(us)
            emit("QGEMV", shape=name, fmt=fmt, N=n, K=kk, kind=kind, arm=arm, us=round(us, 2),
                 bytes=nbytes, gb_s=round(nbytes / us / 1e3, 1), of_bandwidth=round(nbytes / (us * 1e-6) / bw, 3),
                 max_rel_err=err)
    for arm, t in totals.items():
        if len(t) == len(shapes):
            emit("QGEMV_LAYER", arm=arm, us=round(sum(t), 1), bytes=layer_bytes,
                 of_bandwidth=round(layer_bytes / (sum(t) * 1e-6) / bw, 3), world=w,
                 scope="one layer's quantised linears at decode (1 row), rank 0 of --world")


if __name__ == "__main__":
    main()
