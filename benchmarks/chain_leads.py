"""How early each kernel of the decode graph starts before the one it follows ends, from a kernel_table record.

    python benchmarks/chain_leads.py RECORD [--arm graph] [--top 30]

RECORD: the output of `benchmarks/kernel_table.py --sequence` (its KERNEL_SEQ rows: the last token's activities in
launch order, start and duration in us). Under programmatic dependent launch a kernel may start while its predecessor
runs; what it can do then (the loads it is allowed before its wait) hides only where its programs find room on the
SMs. Per (predecessor, successor) pair of kernel names, medians over the token's occurrences:

    CHAIN_LEAD {"pred", "succ", "n", "lead_us" (predecessor's end - successor's start: > 0, started early),
                "us" (the successor's duration), "past_us" (its end after the predecessor's: what it added),
                "advance_us" (kernel_table's additive share)}

ordered by the pairs' summed advance. Session 45 (benchmarks/RESULTS.md): a boundary (32 programs) gives the GEMV
after it ~8 us of lead; a boundary after kernel 2 or wo_b (grids that fill the SMs) gets ~1.3-2.5 us, their drain.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics

from dsv4.receipts import emit


def leads(rows: list[dict]) -> list[dict]:
    pairs = collections.defaultdict(list)
    for a, b in zip(rows, rows[1:]):
        end = a["start_us"] + a["us"]
        pairs[(a["name"], b["name"])].append((end - b["start_us"], b["us"], b["start_us"] + b["us"] - end,
                                              b["advance_us"]))
    out = [{"pred": p[:40], "succ": s[:40], "n": len(v), "lead_us": round(statistics.median(x[0] for x in v), 2),
            "us": round(statistics.median(x[1] for x in v), 2),
            "past_us": round(statistics.median(x[2] for x in v), 2),
            "advance_us": round(statistics.median(x[3] for x in v), 2),
            "advance_sum_us": round(sum(x[3] for x in v), 1)}
           for (p, s), v in pairs.items()]
    return sorted(out, key=lambda r: -r["advance_sum_us"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("record")
    ap.add_argument("--arm", default="graph")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args(argv)
    with open(a.record) as f:
        rows = [json.loads(line.split(" ", 1)[1]) for line in f if line.startswith("KERNEL_SEQ ")]
    rows = [r for r in rows if r["arm"] == a.arm and r.get("rank", 0) == 0]
    if not rows:
        raise SystemExit(f"{a.record}: no KERNEL_SEQ rows of arm {a.arm!r} (run kernel_table.py with --sequence)")
    for r in leads(sorted(rows, key=lambda r: r["i"]))[:a.top]:
        emit("CHAIN_LEAD", r)


if __name__ == "__main__":
    main()
