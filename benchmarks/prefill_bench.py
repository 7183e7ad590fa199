"""Prefill speed and memory: tok/s, time to first token, peak memory; decode right after; DecodeState memory.

    python benchmarks/prefill_bench.py flash [--sizes 4096 32768 131072] [--runs 3] [--long-runs 1]
    python benchmarks/prefill_bench.py mini  [--sizes 64 512 4096] [--runs 3] [--no-hf]

`flash`: random weights over 2 ranks (dsv4.load("flash", device="cuda", ranks=2)); `mini`: one GPU,
beside HF transformers' DeepseekV4ForCausalLM holding the same weights (dsv4.oracle.hf_model_from,
bf16, HF's default experts implementation), one full forward over the same ids in the same process.
Each size: a fresh state of capacity N + ROOM; prefill of the first N - 1 ids with the default chunk
(engine.prefill_chunk of that capacity) or --chunk, then one sampled step on the last id. Median of
--runs runs (--long-runs for sizes above LONG tokens) after one warm-up at the smallest size. Every
record is printed (flushed) when measured, so a run cut short keeps what it measured. Records:

  PREFILL_BUILD  preset, ranks, build wall, GiB allocated per rank after the build, device, commit
  STATE_MEMORY   bytes per rank of a DecodeState at 64k, 128k, 512k and 1M tokens (its buffers built
                 on the meta device) and the default prefill chunk at that capacity
  STATE_FIT      the largest capacity whose state fits beside the weights: alone, and with room for a
                 default prefill chunk (engine.PREFILL_BUDGET plus one layer's dequantised experts, none
                 where dsv4.kernels.prefill_moe runs),
                 and that capped at max_position_embeddings (the largest a state may usefully have)
  PREFILL        N, chunk, chunks, prefill s and tok/s (N - 1 tokens), time to first token (prefill +
                 step), each run's figures, rank 0's peak GiB (ranks are symmetric: even expert and
                 head splits, replicated state), GiB per rank after; store_limit (the env
                 DSV4_PREFILL_STORE_LIMIT: prefill chunks score only the compressed rows committed
                 before them), the sha256 of the last run's logits after its step (rank 0), and with
                 --digest every rank's state digest then: two runs that differ in the env only must
                 print the same logits_sha and digests
  DECODE_AFTER   right after the largest prefill, on its state: arm "eager" (--eager-steps model.step
                 calls) then arm "graph" (enable_replay; the capture step untimed, then --graph-steps
                 replayed steps), tok/s of each: the speed a user sees after a long prompt
  PREFILL_HF     (mini) HF forward s and tok/s on the same N ids (logits of the last position only),
                 peak GiB, max |dsv4 - HF| / max |HF| on the last logits (both bf16: a sanity figure)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time

import torch

import dsv4
from dsv4.engine import PREFILL_BUDGET, prefill_chunk
from dsv4 import kernels
from dsv4.kernels import prefill_moe
from dsv4.sampler import SamplingParams
from dsv4.state import DecodeState
from dsv4.receipts import emit

GIB = 2 ** 30
LONG = 8192  # sizes above this many tokens run --long-runs times (one 128k prefill on Flash is minutes)
ROOM = 128  # capacity past the prompt: the first token, then DECODE_AFTER's eager and graph steps


def commit_id() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except Exception:  # noqa: BLE001 - a record without a commit is still a record
        return "unknown"


def index_kernel(model) -> bool:
    """Whether the engine's default chunk counts the indexer's kernel (rank 0's answer: every rank's is the same)."""
    return getattr(model, "local", model).index_kernel()


def prompt(n: int, vocab: int) -> list[int]:
    return torch.randint(2, vocab, (n,), generator=torch.Generator().manual_seed(n)).tolist()


def prefill_once(model, ids, chunk):
    """(prefill s, time to first token s, rank 0 peak bytes, state, first drawn token) on a fresh state."""
    state = model.new_state(len(ids) + ROOM)
    model.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    model.prefill(state, ids[:-1], chunk_size=chunk)
    model.synchronize()
    t1 = time.perf_counter()
    token = model.step(state, ids[-1], SamplingParams(temperature=0.0))
    t2 = time.perf_counter()
    return t1 - t0, t2 - t0, torch.cuda.max_memory_allocated(), state, token


def bench_prefill(model, name, sizes, runs, long_runs, chunk, eager_steps, graph_steps, digest=False):
    vocab = model.cfg.vocab_size
    prefill_once(model, prompt(min(sizes), vocab), chunk)  # warm-up: allocator, cuBLAS handles, Triton builds
    for n in sizes:
        ids = prompt(n, vocab)
        size_chunk = chunk or prefill_chunk(model.cfg, n + ROOM, model.world, index_kernel(model))
        walls, ttfts, peaks = [], [], []
        state = token = None
        for _ in range(long_runs if n > LONG else runs):
            state = None  # free the last run's state before the next one
            wall, ttft, peak, state, token = prefill_once(model, ids, chunk)
            walls.append(wall), ttfts.append(ttft), peaks.append(peak)
        wall = statistics.median(walls)
        emit("PREFILL", preset=name, ranks=model.world, tokens=n, prefilled=n - 1, chunk=size_chunk,
             chunks=-(-(n - 1) // size_chunk), runs=len(walls), prefill_s=round(wall, 4),
             tok_s=round((n - 1) / wall, 1), ttft_s=round(statistics.median(ttfts), 4),
             prefill_s_runs=[round(w, 4) for w in walls], rank0_peak_gib=round(max(peaks) / GIB, 2),
             gib_per_rank_after=[round(m / GIB, 2) for m in model.each("memory_allocated")],
             kernels=os.environ.get("DSV4_KERNELS", "auto"), moe_dense_above=prefill_moe.CONFIG["dense_above"],
             store_limit=os.environ.get("DSV4_PREFILL_STORE_LIMIT", "1"), logits_sha=model.logits_sha_all(state)[0],
             **({"digests": model.digests_all(state)} if digest else {}))
        if n == max(sizes) and (eager_steps or graph_steps):
            decode_after(model, name, state, token, n, eager_steps, graph_steps)


def decode_after(model, name, state, token, context, eager_steps, graph_steps):
    """Decode on the prefilled state itself: eager steps, then (CUDA) the replayed graph's."""
    sp = SamplingParams(temperature=1.0, seed=7)
    arms = [("eager", eager_steps)] + ([("graph", graph_steps)] if graph_steps and model.device.type == "cuda" else [])
    for arm, steps in arms:
        if not steps:
            continue
        if arm == "graph":
            model.enable_replay(state, sp)
            token = model.step(state, token, sp)  # the capture (and the census's first replay): untimed
        model.synchronize()
        start, t = state.host_pos, time.perf_counter()
        for _ in range(steps):
            token = model.step(state, token, sp)
        model.synchronize()
        wall = time.perf_counter() - t
        emit("DECODE_AFTER", preset=name, ranks=model.world, context=context, position=start, steps=steps, arm=arm,
             tok_s=round(steps / wall, 2), ms_per_token=round(wall / steps * 1e3, 3),
             captures=model.captures(state) if arm == "graph" else 0)


def bench_hf(model, name, sizes, runs):
    from dsv4.oracle import hf_model_from

    hf = hf_model_from(model, dtype=torch.bfloat16)
    impl = getattr(hf.config, "_experts_implementation", None)
    for n in sizes:
        ids = prompt(n, model.cfg.vocab_size)
        x = torch.tensor([ids], device=model.device)
        walls, peak, last = [], 0, None
        try:
            with torch.no_grad():
                hf(x[:, :min(n, 64)], use_cache=False, logits_to_keep=1)  # warm-up
                for _ in range(runs):
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    t = time.perf_counter()
                    last = hf(x, use_cache=False, logits_to_keep=1).logits[0, -1].float()
                    torch.cuda.synchronize()
                    walls.append(time.perf_counter() - t)
                    peak = max(peak, torch.cuda.max_memory_allocated())
        except torch.OutOfMemoryError as e:
            emit("PREFILL_HF", preset=name, tokens=n, error=f"out of memory: {str(e)[:200]}")
            torch.cuda.empty_cache()
            continue
        ours = model.prefill(model.new_state(n + ROOM), ids).float()
        wall = statistics.median(walls)
        emit("PREFILL_HF", preset=name, tokens=n, runs=runs, forward_s=round(wall, 4), tok_s=round(n / wall, 1),
             peak_gib=round(peak / GIB, 2), experts_implementation=impl,
             last_logits_rel_diff=round(float((ours - last).abs().max() / last.abs().max()), 5))
    del hf
    torch.cuda.empty_cache()


def state_memory(model, name, dequant_bytes: int):
    cfg, world = model.cfg, model.world

    def state_bytes(capacity):
        s = DecodeState(cfg, capacity, "meta", model.dtype)
        return sum(t.nbytes for _, t in s.committed()) + s.input.nbytes

    for cap in (1 << 16, 1 << 17, 1 << 19, 1 << 20):
        emit("STATE_MEMORY", preset=name, capacity=cap, gib_per_rank=round(state_bytes(cap) / GIB, 3),
             default_prefill_chunk=prefill_chunk(cfg, cap, world, index_kernel(model)))
    total = torch.cuda.get_device_properties(0).total_memory
    weights = max(model.each("memory_allocated"))
    per_token = (state_bytes(1 << 20) - state_bytes(1 << 19)) / ((1 << 20) - (1 << 19))
    fixed = state_bytes(1 << 19) - per_token * (1 << 19)
    margin = 2 * GIB  # CUDA context, allocator slack, the head's logits
    alone = int((total - weights - margin - fixed) / per_token)
    with_prefill = int((total - weights - margin - PREFILL_BUDGET - dequant_bytes - fixed) / per_token)
    emit("STATE_FIT", preset=name, device_gib=round(total / GIB, 1), weights_gib_per_rank=round(weights / GIB, 2),
         state_bytes_per_token=round(per_token, 1), largest_capacity_decode=alone,
         largest_capacity_with_prefill_chunk=with_prefill, max_position_embeddings=cfg.max_position_embeddings,
         largest_usable_capacity=min(with_prefill, cfg.max_position_embeddings),
         assumed_margin_gib=margin / GIB, prefill_room_gib=round((PREFILL_BUDGET + dequant_bytes) / GIB, 2))


def dequant_stack_bytes(model) -> int:
    """One MoE layer's local experts dequantised (gate|up, the larger of the two stacks made at once); none
    where prefill's FP4 expert kernel runs for every chunk (dsv4.kernels.prefill_moe)."""
    cfg = model.cfg
    if (kernels.use_triton(torch.empty(0, device="cuda"), gpu_checked=prefill_moe.GPU_CHECKED)
            and prefill_moe.CONFIG["dense_above"] is None and cfg.expert_dtype == "fp4"):
        return 0
    n = cfg.n_routed_experts // model.world
    return n * 2 * cfg.moe_intermediate_size * cfg.hidden_size * torch.finfo(model.dtype).bits // 8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("preset", choices=["flash", "mini"])
    ap.add_argument("--sizes", type=int, nargs="+", default=[512, 4096])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--long-runs", type=int, default=1, help=f"runs of a size above {LONG} tokens")
    ap.add_argument("--chunk", type=int, default=None, help="prefill chunk (default: engine.prefill_chunk)")
    ap.add_argument("--eager-steps", type=int, default=16, help="DECODE_AFTER's eager steps (0: none)")
    ap.add_argument("--graph-steps", type=int, default=64, help="DECODE_AFTER's replayed steps (0: none)")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--digest", action="store_true", help="PREFILL records every rank's state digest (sha256 of "
                    "the whole state: seconds at 128k)")
    ap.add_argument("--hf-sizes", type=int, nargs="+", default=None,
                    help=f"sizes HF runs (default: --sizes up to {LONG})")
    ap.add_argument("--moe-dense-above", type=int, default=prefill_moe.CONFIG["dense_above"],
                    help="dsv4.kernels.prefill_moe.CONFIG['dense_above'] (-1: None, the FP4 kernel always)")
    args = ap.parse_args()
    prefill_moe.CONFIG["dense_above"] = None if args.moe_dense_above < 0 else args.moe_dense_above
    if args.eager_steps + args.graph_steps + 2 > ROOM:
        ap.error(f"--eager-steps + --graph-steps must leave room for the first token and the capture: "
                 f"at most {ROOM - 2}")
    ranks = 2 if args.preset == "flash" else 1
    t = time.perf_counter()
    model = dsv4.load(args.preset, device="cuda", ranks=ranks, seed=0)
    model.synchronize()
    emit("PREFILL_BUILD", preset=args.preset, ranks=ranks, build_s=round(time.perf_counter() - t, 1),
         gib_per_rank=[round(m / GIB, 2) for m in model.each("memory_allocated")], dtype=str(model.dtype),
         device=torch.cuda.get_device_name(), commit=commit_id(), torch=torch.__version__)
    state_memory(model, args.preset, dequant_stack_bytes(model))
    bench_prefill(model, args.preset, sorted(args.sizes), args.runs, args.long_runs, args.chunk, args.eager_steps,
                  args.graph_steps, args.digest)
    if args.preset == "mini" and not args.no_hf:
        bench_hf(model, args.preset, sorted(args.hf_sizes or [n for n in args.sizes if n <= LONG]), args.runs)
    if ranks > 1:
        model.close()


if __name__ == "__main__":
    main()
