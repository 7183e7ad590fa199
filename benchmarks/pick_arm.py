"""From a `qgemv_bench.py --rows 1,16` output: the v3 arm (its name matching a regex) worth taking further, or
nothing. Its name is printed when every shape it ran kept v3's bits (bits_as_v3_default) and each row's own
(rows_exact), and its layer time beat v3_default's by 5 % at every row count; the fastest such arm by the sum over
row counts. One record: PICK {"arm": name or null, "arms": the regex, "source": the file}.

    python benchmarks/pick_arm.py qgemv_rows.txt '^v3_whole'
"""

from __future__ import annotations

import json
import re
import sys

from dsv4.receipts import emit


def pick(arms: str, lines: list[str]) -> str | None:
    layer, exact = {}, {}
    for line in lines:
        tag, _, body = line.partition(" ")
        if tag == "QGEMV_ROWS":
            d = json.loads(body)
            layer.setdefault(d["variant"], {})[d["rows"]] = d["us"]
        elif tag == "QGEMV":
            d = json.loads(body)
            exact[d["variant"]] = exact.get(d["variant"], True) and d["bits_as_v3_default"] and d["rows_exact"]
    base = layer.get("v3_default", {})
    best = None
    for arm, times in layer.items():
        if arm == "v3_default" or not re.search(arms, arm) or not exact.get(arm) or set(times) != set(base) or not base:
            continue
        if all(times[r] < 0.95 * base[r] for r in base):
            total = sum(times.values())
            if best is None or total < best[0]:
                best = (total, arm)
    return None if best is None else best[1]


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        emit("PICK", arm=pick(sys.argv[2], f.read().splitlines()), arms=sys.argv[2], source=sys.argv[1])
