"""`dsv4 gate`: the full-token replay falsification gate (the seed's protocol, in Python).

One process group, one model load. It tries to prove the fast path wrong:

1. prime PRIME tokens of a fixed text (first by prefill, the rest one step at a time), draw the
   first output token, print REPLAY_PROTOCOL;
2. correctness: OUTPUT sampled steps on an eager control and a graph candidate restored from the
   same prefix; at every step on every rank the same token, position, logits sha256, cache and
   hidden digests; 2 x layers reductions per step per rank; replay counts; one capture.
   REPLAY_EXACT every 4th position, REPLAY_CENSUS at the end;
3. six live refusal cells (ranks 0 and 1 x three position/layer cells: a CSA window close, an HCA
   window close, a sliding-window wrap with the default sizes), each armed after a live capture and
   replay of the inputs before it: nothing commits, the state is quarantined (REPLAY_REFUSAL);
4. 20 ABBA rows (eager A, graph B) timing OUTPUT tokens end to end from the prefix, each checked
   against the correctness stream (MEASURE), then REPLAY_SUMMARY;
5. --profile: an unscored 32-step window under NVTX ranges, crossing an HCA boundary.
(--batch B: batched steps against solo ones, speculative.py's --speculative K: verify steps against plain ones,
prefix.py's --prefix-cache: prefills through the prefix cache against plain ones, each with a refusal inside, after
step 3.)

Exit 0 only when every check held; the first failing check prints GATE_FAIL with the position,
the field and both values. Where the seed's protocol has no meaning here, the protocol record
says so (`differences`).

checks.py holds what is checked, protocol.py steps 1-3, timing.py steps 4-5; the records go
through dsv4.receipts.
"""

from __future__ import annotations

import sys

import torch

from ..api import load
from ..receipts import Receipts
from .checks import GateFailure, looped, plain
from .protocol import Gate


def run_gate(args) -> int:
    receipts = Receipts(getattr(args, "out", None))
    if args.prime < 8 or args.output < 8:
        print("dsv4 gate: --prime and --output must be at least 8", file=sys.stderr)
        return 2
    if getattr(args, "batch", 0) < 0:
        print(f"dsv4 gate: --batch {args.batch}: a number of rows >= 0", file=sys.stderr)
        return 2
    if not 0 <= getattr(args, "speculative", 0) <= 7:
        print(f"dsv4 gate: --speculative {args.speculative}: drafts a verify step, 0 (off) to 7 (a step's rows stay "
              "within every ring: Flash's compressors hold 8)", file=sys.stderr)
        return 2
    source = args.model or args.preset or "tiny"
    dtype = getattr(torch, args.dtype) if args.dtype else None
    model = load(source, device=args.device, dtype=dtype, ranks=args.ranks, seed=args.weight_seed)
    try:
        Gate(model, args, receipts).run()
        return 0
    except GateFailure as f:
        receipts.emit("GATE_FAIL", {"check": f.check, **{k: plain(v) for k, v in f.detail.items()}})
        return 1
    finally:
        receipts.close()
        close = getattr(model, "close", None)
        if close:
            close()


__all__ = ["Gate", "GateFailure", "Receipts", "looped", "run_gate"]
