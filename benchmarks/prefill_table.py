"""Where a prefill's time goes, by phase and kernel, per rank.

    python benchmarks/prefill_table.py --preset flash --device cuda --ranks 2 --tokens 4096
    python benchmarks/prefill_table.py --preset mini --device cuda --tokens 64 4096
    python benchmarks/prefill_table.py --preset flash --ranks 2 --tokens 512 --prime 130560   # a late chunk
    python benchmarks/prefill_table.py --preset tiny --device cpu --tokens 64 --runs 1   # smoke run (CPU ops)

One load. For each --tokens N: a prefix of --prime tokens (prefilled once, restored before each run),
then a prefill of N tokens in chunks of --chunk (default: engine.prefill_chunk of the capacity
prime + N + 8). Each rank (Model.prefill_table, dsv4.measure.prefill_table): one warm-up, --runs
timed plainly, --runs more under torch.profiler with sub-phase ranges (dsv4.measure.SUB_PHASES).
Records (dsv4.receipts), figures per prefill of N tokens:

  PREFILL_TABLE_TOTAL  rank, tokens, prime, chunk, chunks, wall s (median of the plain runs), tok/s,
                       summed kernel us, busy_fraction = kernel time / wall, provenance
  PREFILL_GROUP        rank, group (attention, compressor+indexer, moe, dense linears, mhc,
                       collectives, head, commit, other), us, share of the kernel time
  PREFILL_PHASE        rank, range (a forward phase or a sub-phase, e.g. moe.dequant), us, kernels
  PREFILL_KERNEL       rank, range, kernel name (shortened), calls, us, share; the --top largest

A collective's kernel time includes its wait for the other rank. On CPU the rows are torch ops with
their host time.
"""

from __future__ import annotations

import argparse

import dsv4
from dsv4.engine import prefill_chunk
from dsv4.kernels import prefill_moe
from dsv4.receipts import Receipts, provenance


def index_kernel(model) -> bool:
    """Whether the engine's default chunk counts the indexer's kernel (rank 0's answer: every rank's is the same)."""
    return getattr(model, "local", model).index_kernel()


def prompt(n: int, vocab: int, seed: int) -> list[int]:
    import torch

    return torch.randint(2, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def table(model, receipts, where, n: int, prime: int, chunk: int | None, runs: int, top: int):
    capacity = prime + n + 8
    chunk = chunk or prefill_chunk(model.cfg, capacity, model.world, index_kernel(model))
    prefix = model.new_state(capacity)
    if prime:
        model.prefill(prefix, prompt(prime, model.cfg.vocab_size, seed=1))
    state = model.new_state(capacity)
    ids = prompt(n, model.cfg.vocab_size, seed=2)
    for rank, t in enumerate(model.each("prefill_table", state, prefix, ids, chunk, runs)):
        total = t["kernel_us"]
        receipts.emit("PREFILL_TABLE_TOTAL", where, rank=rank, ranks=model.world, tokens=n, prime=prime, chunk=chunk,
                      moe_dense_above=prefill_moe.CONFIG["dense_above"],
                      chunks=-(-n // chunk), runs=runs, wall_s=t["wall_s"], walls_s=t["walls_s"],
                      tok_s=round(n / t["wall_s"], 1), kernel_us=total,
                      busy_fraction=round(total / (t["wall_s"] * 1e6), 4), scope=t["scope"])
        for group, us in t["groups"].items():
            receipts.emit("PREFILL_GROUP", rank=rank, tokens=n, prime=prime, group=group, us=us,
                          share=round(us / total, 4) if total else 0.0)
        for name, v in t["phases"].items():
            receipts.emit("PREFILL_PHASE", rank=rank, tokens=n, prime=prime, phase=name, **v)
        for row in t["kernels"][:top]:
            receipts.emit("PREFILL_KERNEL", rank=rank, tokens=n, prime=prime, **row)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--model", default=None, help="a checkpoint directory instead of --preset")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--tokens", type=int, nargs="+", default=[64, 4096])
    ap.add_argument("--prime", type=int, default=0, help="tokens already in the state before the prefill")
    ap.add_argument("--chunk", type=int, default=None, help="prefill chunk (default: engine.prefill_chunk)")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--out", default=None, help="also write the records to this file")
    ap.add_argument("--moe-dense-above", type=int, default=prefill_moe.CONFIG["dense_above"],
                    help="dsv4.kernels.prefill_moe.CONFIG['dense_above'] (-1: None, the FP4 kernel always)")
    args = ap.parse_args(argv)
    prefill_moe.CONFIG["dense_above"] = None if args.moe_dense_above < 0 else args.moe_dense_above
    receipts = Receipts(args.out)
    model = dsv4.load(args.model or args.preset, device=args.device, ranks=args.ranks, seed=0)
    try:
        where = provenance(model.device, args.model or args.preset)
        for n in args.tokens:
            table(model, receipts, where, n, args.prime, args.chunk, args.runs, args.top)
    finally:
        if hasattr(model, "close"):
            model.close()
        receipts.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
